"""Scalars for TensorBoard: the master writes its loss, throughput and metrics as event files.

Tags the master writes (step: the model version): `train/loss`, `train/examples_per_second`,
`worker/<id>/examples_per_second`, `train/tasks_waiting`, `train/tasks_running`,
`train/workers`, `staleness/ps-<id>` (mean staleness of the pushes a shard applied), and
`eval/<metric name>` (step: the model version evaluated).
"""

import logging
import threading

import tensorflow as tf

logger = logging.getLogger(__name__)


class EventWriter:
    """Writes scalars to TensorBoard event files in `logdir`, never failing the job.

    A `logdir` that cannot be created or written logs one warning and the writer becomes a
    no-op; so does any later error while writing. Thread-safe.

    Args:
        logdir: the folder of the event files (created if missing).

    Example:
        writer = EventWriter("/tmp/job/tensorboard")
        writer.scalar("train/loss", 0.25, step=100)
        writer.scalars({"eval/accuracy": 0.9, "eval/loss": 0.3}, step=100)
        writer.close()
    """

    def __init__(self, logdir):
        self.logdir = str(logdir)
        self._lock = threading.Lock()
        self._writer = None
        try:
            self._writer = tf.summary.create_file_writer(self.logdir)
        except Exception as exc:  # noqa: BLE001 - TensorBoard output must not fail the job
            self._give_up("open", exc)

    @property
    def enabled(self):
        """False once the writer has become a no-op (an error, or `close()`)."""
        return self._writer is not None

    def scalar(self, tag, value, step):
        """Writes `value` under `tag` at `step` (an int, e.g. the model version)."""
        self.scalars({tag: value}, step)

    def scalars(self, values, step):
        """Writes every `{tag: value}` of `values` at `step`."""
        with self._lock:
            if self._writer is None:
                return
            try:
                with self._writer.as_default():
                    for tag, value in values.items():
                        tf.summary.scalar(tag, float(value), step=int(step))
            except Exception as exc:  # noqa: BLE001
                self._give_up("write to", exc)

    def flush(self):
        """Writes what is buffered to disk."""
        with self._lock:
            if self._writer is None:
                return
            try:
                self._writer.flush()
            except Exception as exc:  # noqa: BLE001
                self._give_up("write to", exc)

    def close(self):
        """Flushes and closes the event file; later calls do nothing."""
        with self._lock:
            writer, self._writer = self._writer, None
            if writer is None:
                return
            try:
                writer.close()
            except Exception as exc:  # noqa: BLE001
                logger.warning("Could not close TensorBoard events in %s: %s", self.logdir, exc)

    def _give_up(self, action, exc):
        writer, self._writer = self._writer, None
        logger.warning("Could not %s TensorBoard events in %s (%s: %s); writing no more "
                       "TensorBoard events", action, self.logdir, type(exc).__name__, exc)
        if writer is not None:
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - already giving up on this writer
                pass
