"""The job's state apart from the parameters: what a checkpoint records, what a resume reads.

It lives in each checkpoint's `MANIFEST.json` under "job_state", written by
`JobCheckpoints.save` and read back by `JobCheckpoints.find_resumable`.
"""

import dataclasses

from elastic_keras.common.errors import ConfigError

JOB_STATE_FORMAT = 1


@dataclasses.dataclass
class JobState:
    """Which records of which epoch are trained, and what the job did so far.

    Attributes:
        job_name: the job's `--job-name`; a resume checks it.
        tasks: `TaskManager.state()`.
        model_version: the highest model version reported.
        examples_trained: records trained, over every run of the job.
        evaluations: `[{"epoch", "model_version", "end_of_epoch", "metrics"}]`.
        relaunches: `{role name: relaunches}`, counted against the relaunch budgets.
        role_exits: `[{"role", "exit_code", "reason"}]` of roles that stopped early.
        finished: the job had ended when the state was taken.
        stopped_early: the epoch after which a callback ended the job (1-based), or None.
    """

    job_name: str
    tasks: dict
    model_version: int = 0
    examples_trained: int = 0
    evaluations: list = dataclasses.field(default_factory=list)
    relaunches: dict = dataclasses.field(default_factory=dict)
    role_exits: list = dataclasses.field(default_factory=list)
    finished: bool = False
    stopped_early: "int | None" = None

    def to_json(self):
        return {"format": JOB_STATE_FORMAT, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data, where):
        """Reads `to_json()` back; `where` names the checkpoint in errors.

        Raises:
            ConfigError: `data` is not a job state of this format.
        """
        if not isinstance(data, dict) or data.get("format") != JOB_STATE_FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ConfigError(f"{where} holds no job state this version can read (expected "
                              f"format {JOB_STATE_FORMAT}). Received: {found!r}")
        kinds = {"job_name": str, "tasks": dict, "model_version": int,
                 "examples_trained": int, "evaluations": list, "relaunches": dict,
                 "role_exits": list, "finished": bool, "stopped_early": int}
        for name, kind in kinds.items():
            if name in data and not isinstance(data[name], kind) and not (
                    name == "stopped_early" and data[name] is None):
                raise ConfigError(f"{where}: job state field {name!r} must be of type "
                                  f"{kind.__name__}. Received: {data[name]!r:.80}")
        if "job_name" not in data or "tasks" not in data:
            raise ConfigError(f"{where}: the job state lacks 'job_name' or 'tasks'. "
                              f"Received keys: {sorted(data)}")
        return cls(**{name: data[name] for name in kinds if name in data})
