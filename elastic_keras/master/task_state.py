"""What the task queue keeps across a restart of the master, and its checks.

`QueueState` is the queue as plain data: `TaskManager.state()` makes one and writes its
`to_json()` into the job state; `QueueState.from_json` reads it back, checking that it
belongs to the same data, `--records-per-task` and `--num-epochs`.

The JSON: "format" (1); what it was made with: "shards" `[[path, num_records]]`,
"records_per_task", "num_epochs"; "epoch" (num_epochs once the job is over); "last_task_id"
(a restored manager never reuses an id); "waiting" and "running": the current epoch's
training tasks as `[path, start, end, retries, origin]` and `[path, start, end, records_done,
retries, origin]`; "epoch_done_records" and "coverage" (`Coverage.state()`) per epoch;
"lost_tasks" per epoch; "counters"; "slowest_task_s" per task type; "error". Evaluation tasks
are not kept: a round open at the time is not restored.
"""

import dataclasses

from elastic_keras.master.coverage import Coverage
from elastic_keras.master.tasks import TaskType

STATE_FORMAT = 1
COUNTERS = ("tasks_done", "tasks_failed", "tasks_requeued", "tasks_handed_back",
            "tasks_timed_out")


@dataclasses.dataclass
class QueueState:
    """The task queue as plain data (see the module docstring for each field)."""

    shards: list
    records_per_task: int
    num_epochs: int
    epoch: int
    last_task_id: int
    waiting: list        # [(path, start, end, retries, origin)]
    running: list        # [(path, start, end, records_done, retries, origin)]
    epoch_done_records: list
    coverage: list       # [Coverage] per epoch
    lost_tasks: dict     # epoch -> training tasks lost with their worker
    counters: dict       # name in COUNTERS -> count
    slowest_task_s: dict  # TaskType -> seconds
    error: str

    def to_json(self):
        return {
            "format": STATE_FORMAT,
            "shards": [[path, n] for path, n in self.shards],
            "records_per_task": self.records_per_task,
            "num_epochs": self.num_epochs,
            "epoch": self.epoch,
            "last_task_id": self.last_task_id,
            "waiting": [[p, s, e, retries, list(origin)]
                        for p, s, e, retries, origin in self.waiting],
            "running": [[p, s, e, done, retries, list(origin)]
                        for p, s, e, done, retries, origin in self.running],
            "epoch_done_records": list(self.epoch_done_records),
            "coverage": [coverage.state() for coverage in self.coverage],
            "lost_tasks": {str(epoch): n for epoch, n in self.lost_tasks.items()},
            "counters": {name: self.counters[name] for name in COUNTERS},
            "slowest_task_s": {type_.value: s for type_, s in self.slowest_task_s.items()},
            "error": self.error,
        }

    @classmethod
    def from_json(cls, state, shards, records_per_task, num_epochs):
        """Reads `to_json()` back for a queue of `shards`, `records_per_task` and `num_epochs`.

        Raises:
            ValueError: the state is not a format-1 queue state, or it was made with other
                shards, `records_per_task` or `num_epochs`.
        """
        check_state(state, shards, records_per_task, num_epochs)
        try:
            return cls(
                shards=[(str(p), int(n)) for p, n in state["shards"]],
                records_per_task=records_per_task,
                num_epochs=num_epochs,
                epoch=int(state["epoch"]),
                last_task_id=int(state["last_task_id"]),
                waiting=[(str(p), int(s), int(e), int(r), tuple(o))
                         for p, s, e, r, o in state["waiting"]],
                running=[(str(p), int(s), int(e), int(d), int(r), tuple(o))
                         for p, s, e, d, r, o in state["running"]],
                epoch_done_records=[int(n) for n in state["epoch_done_records"]],
                coverage=[Coverage.from_state(c) for c in state["coverage"]],
                lost_tasks={int(e): int(n) for e, n in dict(state.get("lost_tasks", {})).items()},
                counters={name: int(state["counters"][name]) for name in COUNTERS},
                slowest_task_s={TaskType(k): float(s)
                                for k, s in state["slowest_task_s"].items()},
                error=str(state["error"]),
            )
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ValueError(
                f"state is not a valid task manager state; Received: {type(exc).__name__}: "
                f"{exc}"
            ) from exc


def check_state(state, shards, records_per_task, num_epochs):
    """Raises ValueError unless `state` is a format-1 queue state of this data and settings."""
    if not isinstance(state, dict):
        raise ValueError(f"state must be a dict from TaskManager.state(); "
                         f"Received: {type(state).__name__}")
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"state format must be {STATE_FORMAT}; "
                         f"Received: format={state.get('format')!r}")
    saved = {str(path): int(n) for path, n in state.get("shards", ())}
    given = {str(path): int(n) for path, n in shards}
    for path, n in saved.items():
        if path not in given:
            raise ValueError(f"shards must hold every file the state was made with; "
                             f"{path!r} ({n} records) is missing. Received: "
                             f"{len(given)} files: {sorted(given)}")
        if given[path] != n:
            raise ValueError(f"shards must match the state: {path!r} had {n} records. "
                             f"Received: {given[path]} records for {path!r}")
    for path in given:
        if path not in saved:
            raise ValueError(f"shards must hold only files the state was made with; "
                             f"Received: {path!r}, not in the state's {sorted(saved)}")
    for name, value in (("records_per_task", records_per_task), ("num_epochs", num_epochs)):
        if state.get(name) != value:
            raise ValueError(f"{name} must match the state's {state.get(name)!r}; "
                             f"Received: {name}={value!r}")
