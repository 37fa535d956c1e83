"""What the job's status page, `elastic-keras status` and `/metrics` show: a snapshot of the
running master (`snapshot`), with the history of its throughput and loss (`sample`, called
by the master's loop) and its roles' recent exits.

The snapshot is plain JSON data:

- `job`: name, type, engine, state (starting, running, finishing), start time, elapsed;
- `progress`: epoch, records done of the epoch (or of an evaluate/predict round), model
  version, examples/s, loss, tasks waiting and running, workers alive, relaunches;
- `series`: `{t, examples_per_second, loss, version, workers}` about once a second;
- `evaluations`: the results so far;
- `workers`: id, state, host, launch, current task, seconds since its last heartbeat;
- `ps`: id, address, version, seconds since its last heartbeat, table rows, memory;
- `events`: the latest role exits, newest first; `relaunches`: per role, its relaunches;
- `staleness`: per shard, pushes applied by staleness and rejected as stale;
- `tables`: per embedding table, per shard and in total: rows, bytes, rows admitted and
  evicted, lookups not admitted, gradient rows dropped.
"""

import collections
import threading
import time

from elastic_keras.master.instance_manager import RoleType

HISTORY_POINTS = 900
SAMPLE_EVERY_S = 1.0
EVENTS_KEPT = 50


class StatusView:
    """The status of `master` (a `Master`), as data."""

    def __init__(self, master):
        self._master = master
        self._lock = threading.Lock()
        self._series = collections.deque(maxlen=HISTORY_POINTS)
        self._events = collections.deque(maxlen=EVENTS_KEPT)
        self._exits_seen = 0
        self._sampled_at = -SAMPLE_EVERY_S
        self.started = time.time()

    def sample(self):
        """Adds a point to the history (at most one a second) and notes new role exits."""
        now = time.monotonic()
        if now - self._sampled_at < SAMPLE_EVERY_S:
            return
        self._sampled_at = now
        master = self._master
        throughput = master.reports.throughput
        point = {"t": round(time.time() - self.started, 1),
                 "examples_per_second": round(throughput.examples_per_second(), 1),
                 "loss": throughput.loss, "version": master.model_version,
                 "workers": len(master.roles.workers()) if master.roles else 0}
        exits = master.role_exits.exits
        with self._lock:
            self._series.append(point)
            for exit_ in exits[self._exits_seen:]:
                self._events.append({
                    "time": time.time(), "role": exit_.role.name, "what": exit_.describe(),
                    "relaunches": master.role_exits.counts[exit_.role.name]})
            self._exits_seen = len(exits)

    def snapshot(self):
        """The job's status now (see the module)."""
        master = self._master
        with self._lock:
            series, events = list(self._series), list(self._events)
        return {
            "job": self._job(),
            "progress": self._progress(),
            "series": series,
            "evaluations": list(master.evaluations.results),
            "workers": self._workers(),
            "ps": self._shards(),
            "events": events[::-1],
            "relaunches": dict(sorted(master.role_exits.counts.items())),
            "staleness": master.membership.staleness(),
            "tables": master.membership.tables(),
        }

    def _job(self):
        master = self._master
        state = ("finishing" if master.reports.no_more_tasks
                 else "running" if master.tasks is not None and master.membership.ps_addresses()[0]
                 else "starting")
        return {"name": master.config.job_name, "type": master.config.job_type,
                "engine": master.config.engine, "state": state, "started": self.started,
                "elapsed_s": round(time.time() - self.started, 1),
                "master": master.roles.master_address if master.roles else ""}

    def _progress(self):
        master, tasks = self._master, self._master.tasks
        throughput = master.reports.throughput
        progress = {"model_version": master.model_version,
                    "examples_per_second": round(throughput.examples_per_second(), 1),
                    "loss": throughput.loss,
                    "workers_alive": len(master.roles.workers()) if master.roles else 0,
                    "relaunches": sum(master.role_exits.counts.values()),
                    "stopped_early": master.stopped_early}
        if tasks is None:
            return progress
        waiting, running = tasks.depth()
        progress.update(tasks_waiting=waiting, tasks_running=running)
        if master.config.job_type == "train":
            epoch, done, total = tasks.progress()
            progress.update(epoch=epoch + 1, num_epochs=master.config.num_epochs,
                            records_done=done, records_total=total)
        else:
            progress.update(records_done=master.reports.inferred,
                            records_total=tasks.round_records)
        return progress

    def _workers(self):
        master = self._master
        seen, _ = master.membership.view()
        roles = master.roles
        running = ({s.role.index for s in roles.engine.running()
                    if s.role.type == RoleType.WORKER} if roles else set())
        # A worker's newest task is the one it trains (the one before may still be landing).
        held = {r.worker_id: r for r in sorted(
            master.tasks.running_tasks().values() if master.tasks else (),
            key=lambda r: r.task.task_id)}
        rows = []
        for worker_id in sorted(set(seen) | running):
            info = seen.get(worker_id, {"registered": False, "host": "", "heard_s_ago": None})
            if worker_id in (roles.leaving if roles else ()):
                state = "leaving"
            elif worker_id not in running:
                state = "exited"
            else:
                state = "running" if info["registered"] else "starting"
            task = held.get(worker_id)
            rows.append({
                "id": worker_id, "state": state, "host": info["host"],
                "launch": roles.incarnation(worker_id) if roles else None,
                "heard_s_ago": info["heard_s_ago"],
                "examples_per_second": round(
                    master.reports.worker_throughput[worker_id].examples_per_second(), 1)
                if worker_id in master.reports.worker_throughput else 0.0,
                "task": task and {"id": task.task.task_id, "type": task.task.type.value,
                                  "file": task.task.path, "start": task.task.start,
                                  "end": task.task.end, "records_done": task.records_done}})
        return rows

    def _shards(self):
        _, shards = self._master.membership.view()
        return [{"id": ps_id, **info,
                 "state": ("starting" if not info["address"] else "relaunching"
                           if info["heard_s_ago"] is None else "running")}
                for ps_id, info in sorted(shards.items())]
