"""Evaluation results: merging the workers' metric states and closing each round.

Workers evaluate their tasks and send their metrics' states; the states of a round are
merged (`MetricSums`) and turned into results once the round's last task is back.
"""

import logging

from elastic_keras.common.errors import ModelSpecError, PayloadError
from elastic_keras.common.metrics import MetricSums

logger = logging.getLogger(__name__)


class Evaluations:
    """The open round's merged metrics, the results so far, and when the next round is due.

    Args:
        metrics_fn: the module's `eval_metrics_fn`.
        every_steps: `--evaluation-steps`: a round every this many model versions (0: at the
            end of each epoch only).
        events: an `EventWriter` for TensorBoard, or None.
    """

    def __init__(self, metrics_fn, every_steps, events=None):
        self._metrics_fn = metrics_fn
        self._every = every_steps
        self.results = []
        self.events = events
        self._sums = MetricSums()
        self._versions = []  # versions the open round's tasks were evaluated at
        self._next_version = every_steps

    def resume(self, results, model_version):
        """Carries on a resumed job: its earlier `results`, at `model_version`."""
        self.results = list(results)
        self._next_version = model_version + self._every

    def check(self, metric_states):
        """Why one evaluation task's metric states cannot be merged into the round or
        turned into results with the others (the task's attempt then fails), or ""."""
        try:
            self._sums.check(metric_states, self._metrics_fn)
        except (PayloadError, ModelSpecError) as exc:
            return f"its evaluation metrics cannot be merged: {exc}"
        except Exception as exc:  # noqa: BLE001 - the module's metrics raised: named
            return (f"the module's metrics raised {type(exc).__name__} on its states: "
                    f"{exc}")
        return ""

    def add(self, metric_states, model_version):
        """Merges one evaluation task's metric states, checked with `check` first."""
        self._sums.add(metric_states)
        self._versions.append(model_version)

    def due(self, model_version):
        """Whether a mid-epoch round is due at `model_version` (`--evaluation-steps`)."""
        return bool(self._every) and model_version >= self._next_version

    def started(self, model_version):
        """A mid-epoch round was opened at `model_version`."""
        self._next_version = model_version + self._every

    def close(self, finished_round):
        """Turns the round's merged states into results; returns them as recorded."""
        try:
            metrics = self._sums.results(self._metrics_fn)
        except Exception as exc:  # noqa: BLE001 - each task's states were checked: logged
            logger.error("The evaluation's metrics cannot be computed: %s", exc)
            metrics = {}
        self._sums = MetricSums()
        # Workers report the version they evaluated; with training paused it is one version.
        version = max(self._versions, default=finished_round.model_version)
        self._versions = []
        if self._every:  # the next round comes that many versions later
            self._next_version = max(self._next_version, version + self._every)
        result = {"epoch": finished_round.epoch + 1, "model_version": version,
                  "end_of_epoch": finished_round.end_of_epoch, "metrics": metrics}
        self.results.append(result)
        shown = ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in metrics.items())
        when = "after epoch" if finished_round.end_of_epoch else "during epoch"
        logger.info("Evaluation %s %d (model version %d): %s", when, result["epoch"], version,
                    shown)
        if self.events:
            self.events.scalars({f"eval/{k}": v for k, v in metrics.items()
                                 if isinstance(v, (int, float))}, version)
            self.events.flush()
        return result
