"""The module's `callbacks()`, run by the master at the job's epochs as Keras's `fit` runs
them.

The master calls `on_train_begin`, `on_epoch_begin` (before any task of the epoch is handed
out), `on_epoch_end` (once the epoch is trained and its closing evaluation is in) and
`on_train_end`, with `logs` as `fit` gives them: `loss`, the epoch's mean training loss, and
`val_<name>` for each metric of the evaluation that closed the epoch. Batch-level hooks are
not called: batches run on the workers. The callbacks see a stand-in for the model:

- `model.optimizer.learning_rate` reads and sets the parameter servers' rate
  (`LearningRateScheduler`, `ReduceLROnPlateau`; a relaunched shard is given the rate set);
- `model.stop_training = True` (`EarlyStopping`) ends the job after the epoch, succeeded,
  its summary saying `stopped_early`;
- `model.save(path)` / `model.save_weights(path)` (`ModelCheckpoint`, `save_freq="epoch"`)
  write the model built with the shards' current values (a best-model export);
- a `TensorBoard` callback's `log_dir` is where the job's events go; its hooks are not run.

User subclasses of `keras.callbacks.Callback`, `CSVLogger`, `LambdaCallback`,
`RemoteMonitor` and `History` get the same calls. Other Keras callbacks need the model in the
process that trains it and are refused when the module is checked, as are settings that need
it (`EarlyStopping(restore_best_weights=True)`, a batch-level `save_freq`), monitors of values
the job does not log, and a learning-rate callback with a scheduled learning rate. A callback
that raises fails the job, naming it.
"""

import logging

import keras

from elastic_keras.common.errors import ModelSpecError
from elastic_keras.common.metrics import build_metrics

logger = logging.getLogger(__name__)

_CB = keras.callbacks
_LR_SETTERS = (_CB.LearningRateScheduler, _CB.ReduceLROnPlateau)
_MONITORS = (_CB.EarlyStopping, _CB.ReduceLROnPlateau, _CB.ModelCheckpoint)
_RUN = _LR_SETTERS + _MONITORS + (_CB.CSVLogger, _CB.LambdaCallback, _CB.RemoteMonitor,
                                   _CB.History)
_WHY_NOT = {
    "BackupAndRestore": "a job resumes from its --checkpoint-dir",
    "TerminateOnNaN": "use --on-non-finite-loss fail",
    "ProgbarLogger": "the master shows the job's progress",
    "SwapEMAWeights": "evaluation and export already use the moving averages",
}


class JobCallbacks:
    """The callbacks of one job, checked.

    Args:
        spec: the `ModelSpec`.
        config: the job's `JobConfig`.

    Raises:
        ModelSpecError: a callback or setting the job cannot honour (see the module).
    """

    def __init__(self, spec, config):
        trains = spec.callbacks is not None and config.job_type == "train"
        callbacks = list(spec.callbacks()) if trains else []
        self.log_dir = ""
        self.model = _ModelView(spec, config)
        self._callbacks = []
        metrics = build_metrics(spec.eval_metrics_fn) if spec.eval_metrics_fn else {}
        logged = {"loss"} | ({f"val_{n}" for n in metrics} if config.validation_data else set())
        for callback in callbacks:
            _check(callback, spec, logged, metrics)
            if isinstance(callback, _CB.TensorBoard):
                self.log_dir = str(callback.log_dir)
                continue
            callback.set_model(self.model)
            self._callbacks.append(callback)

    def __bool__(self):
        return bool(self._callbacks)

    def begin(self, ps_client, sample_features, tasks, reports):
        """Once the shards answer: gives the model stand-in the shards (`ps_client`) and a
        `sample_features()` to build the model from, begins training and the first epoch,
        then lets `reports` hand tasks out."""
        self.model.bind(ps_client, sample_features)
        self._each("on_train_begin", {})
        self._each("on_epoch_begin", tasks.epoch, {})
        reports.paused = False

    def next_epoch(self, tasks, throughput, evaluations):
        """The epoch is trained and evaluated (`evaluations`: the results so far): runs
        `on_epoch_end`, then begins the next epoch (no task of it goes out before), unless
        a callback stopped the job. Returns the epoch it stopped after (1-based), or None.
        """
        epoch, num_epochs = tasks.epoch, tasks.num_epochs
        logs = {"loss": throughput.take_epoch_loss()}
        closing = [e for e in evaluations if e["epoch"] == epoch + 1 and e["end_of_epoch"]]
        logs.update({f"val_{k}": v for e in closing[-1:] for k, v in e["metrics"].items()})
        self._each("on_epoch_end", epoch, {k: v for k, v in logs.items() if v is not None})
        stopped = epoch + 1 if self.model.stop_training else None
        if stopped:
            logger.info("A callback stopped the job after epoch %d of %d", stopped, num_epochs)
        elif epoch + 1 < num_epochs:
            self._each("on_epoch_begin", epoch + 1, {})
        tasks.next_epoch(stop=bool(stopped))
        return stopped

    def _each(self, hook, *args):
        for callback in self._callbacks:
            try:
                getattr(callback, hook)(*args)
            except Exception as exc:  # noqa: BLE001 - the user's: it fails the job, named
                raise CallbackError(f"{type(callback).__name__}.{hook} raised "
                                    f"{type(exc).__name__}: {exc}") from exc

    def train_end(self, logs):
        self._each("on_train_end", logs)


class CallbackError(Exception):
    """A callback raised: the job fails with this message."""


def _check(callback, spec, logged, metrics):
    name = type(callback).__name__
    where = f"Model module '{spec.module_name}': callbacks()"
    if not isinstance(callback, _CB.Callback):
        raise ModelSpecError(f"{where} must return keras.callbacks.Callback instances. "
                             f"Received: {callback!r} ({name})")
    builtin = type(callback).__module__.startswith("keras.")
    if builtin and not isinstance(callback, _RUN + (_CB.TensorBoard,)):
        why = _WHY_NOT.get(name, "it needs the model in the process that trains it")
        raise ModelSpecError(f"{where} returned {name}, which a job cannot run: {why}. "
                             f"Supported: {', '.join(sorted(c.__name__ for c in _RUN))}, "
                             "TensorBoard and your own Callback subclasses")
    if isinstance(callback, _CB.EarlyStopping) and callback.restore_best_weights:
        raise ModelSpecError(f"{where}: EarlyStopping(restore_best_weights=True) needs the "
                             "model's weights in the master; use a ModelCheckpoint with "
                             "save_best_only=True to keep the best model")
    if isinstance(callback, _CB.ModelCheckpoint) and callback.save_freq != "epoch":
        raise ModelSpecError(f"{where}: ModelCheckpoint saves once an epoch here. Received: "
                             f"save_freq={callback.save_freq!r}")
    if isinstance(callback, _LR_SETTERS):
        optimizer = spec.optimizer()
        if isinstance(optimizer._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            raise ModelSpecError(f"{where}: {name} sets the learning rate, but optimizer() has "
                                 "a schedule as its learning rate, which cannot be set")
    if isinstance(callback, _MONITORS) and (not isinstance(callback, _CB.ModelCheckpoint)
                                            or callback.save_best_only):
        _check_monitor(callback, where, logged, metrics)


def _check_monitor(callback, where, logged, metrics):
    name = type(callback).__name__
    if callback.monitor not in logged:
        raise ModelSpecError(
            f"{where}: {name} monitors {callback.monitor!r}, which this job does not log. "
            f"Logged: {', '.join(sorted(logged))} (val_<metric> needs --validation-data and "
            "eval_metrics_fn)")
    metric = metrics.get(callback.monitor.removeprefix("val_"))
    if callback.mode == "auto" and callback.monitor.removeprefix("val_") != "loss":
        direction = getattr(metric, "_direction", None)
        if direction not in ("up", "down"):
            raise ModelSpecError(f"{where}: {name} cannot tell whether {callback.monitor!r} "
                                 "should go up or down: pass mode='max' or mode='min'")
        callback.mode = "max" if direction == "up" else "min"


class _ModelView:
    """What Keras callbacks use of a model, backed by the job (see the module)."""

    def __init__(self, spec, config):
        self.stop_training = False
        self.optimizer = _OptimizerView(_float_rate(spec.optimizer()))
        self.metrics = []
        self._spec = spec
        self._config = config
        self._sample = None

    def bind(self, ps_client, sample_features):
        self.optimizer.ps_client = ps_client
        self._sample = sample_features

    def _built(self):
        from elastic_keras.master.export import trained_model

        return trained_model(self._spec, self.optimizer.ps_client, self._sample(),
                             self._config.embedding_threshold_params)

    def save(self, filepath, overwrite=True, **kwargs):
        self._built().save(filepath, overwrite=overwrite, **kwargs)
        logger.info("Saved the model to %s", filepath)

    def save_weights(self, filepath, overwrite=True, **kwargs):
        self._built().save_weights(filepath, overwrite=overwrite, **kwargs)
        logger.info("Saved the model's weights to %s", filepath)


class _OptimizerView:
    """`model.optimizer.learning_rate`, on the parameter servers; `set_rate` is the rate
    callbacks set (None: the module's), which a relaunched shard is given."""

    def __init__(self, module_rate):
        self.ps_client = None
        self.set_rate = None
        self.module_rate = module_rate

    @property
    def learning_rate(self):
        answer = self.ps_client.learning_rate()[0]
        if answer.HasField("learning_rate"):
            return answer.learning_rate
        return self.module_rate  # no model and no rate set yet: InitModel brings the module's

    @learning_rate.setter
    def learning_rate(self, value):
        rate = float(value)
        self.ps_client.learning_rate(rate)
        if rate != self.set_rate:
            logger.info("Learning rate set to %g", rate)
        self.set_rate = rate


def _float_rate(optimizer):
    rate = optimizer._learning_rate
    return None if callable(rate) else float(keras.ops.convert_to_numpy(rate))
