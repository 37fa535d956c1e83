"""The job's outcome, written to `--output/job_summary.json`, and how it is built."""

import dataclasses
import enum
import json
import os
import time

from elastic_keras.common.atomic_file import atomic_write

INTERRUPTED = "interrupted (Ctrl-C or SIGTERM)"


class JobStatus(str, enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM stopped it; a resume carries on


@dataclasses.dataclass
class JobSummary:
    """What happened: status, per-epoch record counts, tasks, versions, speed, metrics."""

    job_name: str
    status: JobStatus
    error: str
    num_workers: int
    num_ps: int
    epochs: list            # [EpochCounts as dict + "trained_never"]
    tasks_done: int
    tasks_failed: int
    tasks_requeued: int
    final_model_version: int
    wall_time_s: float
    training_time_s: float
    examples_trained: int
    examples_per_second: float
    evaluations: list       # [{"epoch", "model_version", "end_of_epoch", "metrics"}]
    staleness: dict         # per shard: applied pushes by staleness, rejections
    role_exits: list        # [{"role", "exit_code", "reason"}] of roles that stopped early
    saved_model: str = ""
    # resumed_from, relaunches per role, tasks handed back, checkpoints written, last
    # checkpoint, and the bound on records trained twice per lost task attempt
    recovery: dict = dataclasses.field(default_factory=dict)
    # "by_worker": minibatches trained and pushes dropped per shard (see `push_account`);
    # "applied_by_shard": per shard, the pushes of each worker it holds; "skipped_by_worker":
    # per worker, the minibatches it did not push, by reason
    pushes: dict = dataclasses.field(default_factory=dict)
    # Training minibatches no worker pushed, by reason: {"non_finite_loss": n} counts NaN or
    # Inf losses skipped with --on-non-finite-loss skip
    skipped_minibatches: dict = dataclasses.field(default_factory=dict)
    job_type: str = "train"
    # evaluate, predict, export: "checkpoints" (one per ensemble member), "records"
    # evaluated or predicted, and where predictions went ("predictions")
    outputs: dict = dataclasses.field(default_factory=dict)
    # The epoch after which a callback (EarlyStopping) ended the job, or None
    stopped_early: "int | None" = None
    # Per embedding table, per shard ("ps-N") and in "total": rows held, bytes, rows
    # admitted and evicted, lookups not admitted and gradient rows dropped, as last reported
    tables: dict = dataclasses.field(default_factory=dict)

    def to_dict(self):
        data = dataclasses.asdict(self)
        data["status"] = self.status.value
        return data

    def write(self, path):
        with atomic_write(path, "w") as f:
            f.write(json.dumps(self.to_dict(), indent=2) + "\n")


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """What the summary needs of this run beyond the job state.

    Attributes:
        error: why the run failed, or "".
        started: when the run began (`time.time()`).
        training_started: when its first task went out, or None.
        training_ended: when its training ended, or None (still going).
        records: records trained in this run.
        num_workers: the workers asked for at the end (`elastic-keras scale` included).
        resumed_from: the checkpoint the run resumed from, or "".
        pushes: minibatches and dropped pushes per worker (`PushAccount.by_worker`).
        skipped: `Reports.skipped_minibatches()`: ({reason: n}, {worker: {reason: n}}).
        outputs: `JobOutputs.summary()`.
        stopped_early: the epoch after which a callback ended the job (1-based), or None.
    """

    error: str
    started: float
    training_started: "float | None"
    training_ended: "float | None"
    records: int
    num_workers: int
    resumed_from: str
    pushes: dict
    skipped: tuple = ({}, {})
    outputs: dict = dataclasses.field(default_factory=dict)
    stopped_early: "int | None" = None


def duplicates_bound(config):
    """Records a lost task attempt may have trained that its next attempt trains again.

    The attempt is retrained from its worker's last progress report: at most a reporting
    interval of landed minibatches lies past it, plus the one whose push was in flight (it
    may land after its worker died).
    """
    return (config.progress_report_minibatches + 1) * config.minibatch_size


def epoch_records(tasks, bound):
    """Per epoch, as the summary shows it: records trained never, once, more than once."""
    return [{
        "epoch": counts.epoch + 1,
        "records": counts.total,
        "trained_at_least_once": counts.trained_at_least_once,
        "trained_more_than_once": counts.trained_more_than_once,
        # Records trained past a lost task's last report are trained again unseen: at most
        # `bound` per lost task.
        "tasks_lost": counts.tasks_lost,
        "trained_more_than_once_at_most": (counts.trained_more_than_once
                                           + counts.tasks_lost * bound),
        "trained_never": counts.total - counts.trained_at_least_once,
        "training_s": counts.training_s,
    } for counts in (tasks.epoch_counts() if tasks else [])]


def build_summary(config, run, state, tasks, membership, checkpoints):
    """The `JobSummary` of a job that has ended.

    Args:
        config: the job's `JobConfig`.
        run: this run's `RunFacts`.
        state: the job's final `JobState` (over every run of a resumed job).
        tasks: the `TaskManager`, or None if the job ended before it had one.
        membership: the job's `Membership`.
        checkpoints: the job's `JobCheckpoints`.
    """
    now = time.time()
    bound = duplicates_bound(config)
    trains = config.job_type == "train"
    epochs = epoch_records(tasks, bound) if trains else []
    if run.stopped_early:  # the epochs after it were never meant to run
        epochs = epochs[:run.stopped_early]
    error = run.error or (tasks.error if tasks else "")
    status = JobStatus.FAILED if error or tasks is None else JobStatus.SUCCEEDED
    if status == JobStatus.SUCCEEDED and any(e["trained_never"] for e in epochs):
        status, error = JobStatus.FAILED, "some records were never trained"
    if error == INTERRUPTED:
        status = JobStatus.INTERRUPTED
    started = run.training_started
    training_time = (run.training_ended or now) - started if started else 0.0
    counters = {name: getattr(tasks, name) if tasks else 0
                for name in ("tasks_done", "tasks_failed", "tasks_requeued",
                             "tasks_handed_back", "tasks_timed_out")}
    return JobSummary(
        job_name=config.job_name, status=status, error=error,
        num_workers=run.num_workers, num_ps=config.num_ps, epochs=epochs,
        tasks_done=counters["tasks_done"], tasks_failed=counters["tasks_failed"],
        tasks_requeued=counters["tasks_requeued"],
        final_model_version=state.model_version,
        wall_time_s=round(now - run.started, 3),
        training_time_s=round(training_time, 3),
        examples_trained=state.examples_trained,
        examples_per_second=round(run.records / training_time, 1) if training_time else 0.0,
        evaluations=state.evaluations,
        staleness=membership.staleness(),
        role_exits=state.role_exits,
        saved_model=(os.path.join(config.output, "saved_model")
                     if config.output and status == JobStatus.SUCCEEDED
                     and config.job_type in ("train", "export") else ""),
        recovery={
            "resumed_from": run.resumed_from,
            "relaunches": dict(sorted(state.relaunches.items())),
            "tasks_handed_back": counters["tasks_handed_back"],
            "tasks_timed_out": counters["tasks_timed_out"],
            "checkpoints_written": checkpoints.written,
            "last_checkpoint": checkpoints.last_path,
            "duplicates_bound_per_lost_task": bound,
        },
        pushes={"by_worker": run.pushes, "applied_by_shard": membership.applied_pushes(),
                "skipped_by_worker": run.skipped[1]},
        skipped_minibatches=run.skipped[0],
        job_type=config.job_type, outputs=run.outputs, stopped_early=run.stopped_early,
        tables=membership.tables(),
    )
