"""The master's side of checkpoints: when to take one, taking it, and what a job resumes from.

A checkpoint is a directory `CHECKPOINT_DIR/ckpt-N/` (see `common/checkpoint_layout.py`) whose
shard files belong together: every one holds the same minibatches. The master takes one in
four steps, so that the job state it records never claims more than the parameters hold:

1. it snapshots its job state (which records of which epoch are trained, counters,
   evaluations); a record counts as trained only once its worker's push has landed;
2. it has every shard hold pushes back (`PrepareCheckpoint`), which answers with the
   minibatches it has applied; the cut is, per live worker, the latest minibatch any shard
   applied (a worker's push may have reached one shard and not yet another);
3. it asks every shard to save at that cut (`SaveCheckpoint`): a shard lets in the held
   pushes the cut holds, waits until it has them all, applies its open synchronous round,
   snapshots, lets pushes through again and writes its file (each file then holds every
   update the job state counts, and the same minibatches as the others);
4. it writes `MANIFEST.json`, holding the job state, last and atomically: only then is the
   checkpoint complete, and older ones beyond `--keep-checkpoint-max` are deleted.

A shard that does not reach the cut while it holds (`HOLD_S`: a worker died between two
shards) fails the checkpoint, which is skipped; the previous one stays the latest. Updates
that land between steps 1 and 2 are in the shards but not in the job state; after a resume
their records are trained again (counted as "more than once").
"""

import logging
import os
import time

import grpc

from elastic_keras.common import checkpoint_layout, job_types
from elastic_keras.common.errors import CheckpointError, ConfigError
from elastic_keras.master.job_state import JobState

logger = logging.getLogger(__name__)

HOLD_S = 30.0  # how long shards hold pushes back for a checkpoint at most
PREPARE_TIMEOUT_S = 10.0  # a shard answers PrepareCheckpoint at once unless it is hung


class JobCheckpoints:
    """Checkpoints of one job in `root` (`--checkpoint-dir`).

    Args:
        root: the checkpoint directory; "" disables checkpoints.
        steps: checkpoint every this many model versions (0: only when asked, at the end).
        keep_max: complete checkpoints to keep (0: all).
        job_name: the job's name, recorded in each checkpoint and checked on resume.
    """

    def __init__(self, root, steps, keep_max, job_name):
        # Absolute, as the shards are told it (`JobConfig.ps_config`).
        self.root = os.path.abspath(root) if root else ""
        self.steps = steps
        self.keep_max = keep_max
        self.job_name = job_name
        self.written = 0
        self.last_path = ""
        self._next_version = steps

    @property
    def enabled(self):
        return bool(self.root)

    def find_resumable(self):
        """The newest complete checkpoint of this job, as `(path, JobState)`, or None.

        Raises:
            ConfigError: the directory holds another job's checkpoints, or a job state this
                version cannot read.
        """
        if not self.enabled:
            return None
        found = checkpoint_layout.latest_complete(self.root)
        if found is None:
            return None
        path, manifest = found
        state = JobState.from_json(manifest.get("job_state"), f"--checkpoint-dir {path}")
        if state.job_name != self.job_name:
            raise ConfigError(
                f"--checkpoint-dir {self.root} holds checkpoints of job {state.job_name!r}, "
                f"not of this job {self.job_name!r}. Pass --job-name {state.job_name} to "
                "resume that job, or use another directory."
            )
        self.last_path = path
        self._next_version = state.model_version + self.steps
        return path, state

    def latest(self):
        """The newest complete checkpoint's path (what a relaunched shard restores), or ""."""
        if not self.enabled:
            return ""
        try:
            found = checkpoint_layout.latest_complete(self.root)
        except CheckpointError as exc:
            logger.warning("Cannot read %s: %s", self.root, exc)
            return ""
        return found[0] if found else ""

    def due(self, model_version):
        """Whether `--checkpoint-steps` versions have passed since the last checkpoint."""
        return self.enabled and self.steps > 0 and model_version >= self._next_version

    def save(self, ps_client, job_state, live_workers=None):
        """Takes a checkpoint holding `job_state`, a `JobState` the caller took just before.

        Args:
            live_workers: ids of the workers that may have a push in flight (those running
                a training task); the cut waits for their minibatches only (None: for every
                worker's a shard applied). Another worker's pushes have all settled.

        Returns:
            The checkpoint's path, or "" when it failed (logged; the previous one stays the
            latest, and the incomplete directory is deleted by a later prune).
        """
        started = time.monotonic()
        try:
            number = checkpoint_layout.next_number(self.root)
            path = checkpoint_layout.checkpoint_path(self.root, number)
            try:
                cut = ps_client.prepare_checkpoint(number, HOLD_S, PREPARE_TIMEOUT_S)
                if live_workers is not None:
                    cut = {w: s for w, s in cut.items() if w in live_workers}
                shards = ps_client.save_checkpoint(number, HOLD_S + 30.0, cut)
            except grpc.RpcError:
                ps_client.release_checkpoint(number, timeout_s=5.0)
                raise
            checkpoint_layout.write_manifest(path, {
                "number": number,
                "num_ps": len(shards),
                "shards": [{"file": s.file, "bytes": s.bytes, "crc32c": s.crc32c,
                            "model_version": s.model_version} for s in shards],
                "created": time.time(),
                "job_state": job_state.to_json(),
            })
            checkpoint_layout.prune(self.root, self.keep_max)
        except (grpc.RpcError, OSError, CheckpointError) as exc:
            details = exc.details() if isinstance(exc, grpc.RpcError) else exc
            logger.warning("Checkpoint failed (%s); the previous one stays the latest.",
                           details)
            return ""
        self.written += 1
        self.last_path = path
        version = job_state.model_version
        self._next_version = version + self.steps
        logger.info("Checkpoint %s written at model version %d in %.1f s", path, version,
                    time.monotonic() - started)
        return path


def init_checkpoints(config):
    """The checkpoint each model of the job starts from: the newest complete one of each
    `--checkpoint-dir-for-init` directory, or with `--ensemble last-K` the K newest of one
    (newest first).

    Raises:
        ConfigError: a directory holds no complete checkpoint, or fewer than K.
    """
    k = job_types.ensemble_size(config)
    if not k:
        return [init_checkpoint(d) for d in config.init_checkpoints]
    directory = config.init_checkpoints[0]
    complete = []
    for _, path in reversed(checkpoint_layout.list_checkpoints(os.path.abspath(directory))):
        try:
            checkpoint_layout.check_complete(path)
        except CheckpointError as exc:
            logger.warning("Skipping checkpoint %s: %s", path, exc)
            continue
        complete.append(path)
        if len(complete) == k:
            return complete
    raise ConfigError(f"--ensemble last-{k} needs {k} complete checkpoints in "
                      f"--checkpoint-dir-for-init {directory}. Received: {len(complete)} "
                      f"({', '.join(complete) or 'none'})")


def init_checkpoint(directory):
    """The newest complete checkpoint in `--checkpoint-dir-for-init`.

    Raises:
        ConfigError: there is none (naming the directory and what it holds).
    """
    try:
        found = checkpoint_layout.latest_complete(os.path.abspath(directory))
    except CheckpointError as exc:
        raise ConfigError(f"--checkpoint-dir-for-init {directory}: {exc}") from exc
    if found is None:
        held = [p for _, p in checkpoint_layout.list_checkpoints(directory)]
        raise ConfigError(
            f"--checkpoint-dir-for-init {directory} holds no complete checkpoint (a "
            f"ckpt-N directory with MANIFEST.json and every shard file intact). Received: "
            f"{', '.join(held) or 'no ckpt-N directories'}"
        )
    return found[0]
