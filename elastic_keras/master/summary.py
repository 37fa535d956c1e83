"""The job's outcome, written to `--output/job_summary.json`."""

import dataclasses
import enum
import json

from elastic_keras.common.atomic_file import atomic_write


class JobStatus(str, enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"


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
    evaluations: list       # [{"epoch", "model_version", "metrics"}]
    staleness: dict         # per shard: applied pushes by staleness, rejections
    role_exits: list        # [{"role", "exit_code"}] of roles that stopped before the end
    saved_model: str = ""
    # resumed_from, relaunches per role, tasks handed back, checkpoints written, last
    # checkpoint, and the bound on records trained twice per lost task attempt
    recovery: dict = dataclasses.field(default_factory=dict)
    # "by_worker": minibatches trained and pushes dropped per shard (see `push_account`);
    # "applied_by_shard": per shard, the pushes of each worker it holds
    pushes: dict = dataclasses.field(default_factory=dict)

    def to_dict(self):
        data = dataclasses.asdict(self)
        data["status"] = self.status.value
        return data

    def write(self, path):
        with atomic_write(path, "w") as f:
            f.write(json.dumps(self.to_dict(), indent=2) + "\n")
