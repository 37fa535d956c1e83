"""A user's model-zoo module checked against the contract (ARCHITECTURE.md, "Model-zoo contract").

`load_model_spec` imports the module that `--model-def` names (with `module_loader`) and
collects the functions the contract asks for into a `ModelSpec`, rejecting a missing or
non-callable name at once. `ModelSpec.check` goes one step further and calls `optimizer()` and `custom_model()` to see
that they return what they must; it is a separate step because building a model costs time
and leaves layers in Keras' global state, which the caller may want to clear afterwards.
What only shows while training, the worker checks with `ModelSpec.minibatches` (the
structure of what the module's input function yields) and `ModelSpec.check_loss` (a scalar
loss).

A module parses its records one at a time with `dataset_fn(dataset, mode, metadata)` (the
worker batches what it yields), or opts in to parsing a whole minibatch at once with
`batch_dataset_fn(dataset, mode, metadata)`, whose dataset yields 1-D string tensors of up to
`--minibatch-size` raw records, in file order, and which must yield one minibatch of
`(features, labels)` per minibatch of records, a row per record. TensorFlow's batch parsers
(`tf.io.parse_example`, `tf.io.decode_csv` of a vector) run one to two orders of magnitude
faster than the same parsing per record. When a module defines both, the worker uses
`batch_dataset_fn`.

Example:

    >>> spec = load_model_spec("model_zoo", "mnist.mnist_functional")
    >>> spec.check()
    >>> spec.dataset_fn(dataset, Mode.TRAINING, metadata)  # doctest: +SKIP
"""

import dataclasses
import enum
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import keras

from elastic_keras.common.errors import ModelSpecError
from elastic_keras.common.module_loader import import_model_module, module_origin
from elastic_keras.common.optimizer_contract import check_optimizer


class Mode(str, enum.Enum):
    """What a `dataset_fn` prepares records for; equal to the plain strings users compare to.

    Example:

        >>> Mode.TRAINING == "training"
        True
        >>> f"{Mode.PREDICTION}"
        'prediction'
    """

    TRAINING = "training"
    EVALUATION = "evaluation"
    PREDICTION = "prediction"

    def __str__(self):
        return self.value

    def __format__(self, format_spec):
        return format(self.value, format_spec)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The functions a model-zoo module defines, as `load_model_spec` found them.

    Attributes:
        module_name: the module as the user named it: a dotted name relative to the model
            zoo, or the path of a `.py` file. Error messages use it.
        custom_model: `custom_model()` (or the function `--model-def` names), which returns a
            `keras.Model`.
        loss: `loss(labels, predictions)`, which returns a scalar loss tensor.
        optimizer: `optimizer()`, which returns a `keras.optimizers.Optimizer`.
        dataset_fn: `dataset_fn(dataset, mode, metadata)` (or the module's `feed`), which maps
            a dataset of raw records to `(features, labels)`, or to features alone when `mode`
            is `"prediction"`; None if the module defines only `batch_dataset_fn`.
        eval_metrics_fn: `eval_metrics_fn()`, which returns `{name: metric}`; None if the module
            does not define it.
        callbacks: `callbacks()`, which returns a list of callbacks; None if absent.
        prediction_outputs_processor: the module's `PredictionOutputsProcessor` class, whose
            instances have `process(predictions, worker_id)`; None if absent.
        batch_dataset_fn: `batch_dataset_fn(dataset, mode, metadata)`, as `dataset_fn` but
            over minibatches of raw records; None if absent.
    """

    module_name: str
    custom_model: Callable[[], Any]
    loss: Callable[[Any, Any], Any]
    optimizer: Callable[[], Any]
    dataset_fn: Callable[[Any, str, Any], Any]
    eval_metrics_fn: Callable[[], Any] | None = None
    callbacks: Callable[[], Any] | None = None
    prediction_outputs_processor: type | None = None
    batch_dataset_fn: Callable[[Any, str, Any], Any] | None = None

    def check(self) -> None:
        """Calls the factory functions and checks the kind of object each returns.

        Calls `optimizer()`, `custom_model()` and, where defined, `eval_metrics_fn()` and
        `callbacks()`. The model built here is not kept; Keras' global state (layer-name
        counters) is left as it is, for the caller to clear with `keras.utils.clear_session()`
        if it wants.

        Raises:
            ModelSpecError: a function raised, or returned the wrong kind of object: the
                optimizer is not a `keras.optimizers.Optimizer`, the model not a `keras.Model`,
                the metrics not a dict of Keras metrics or functions, the callbacks not a list.

        Example:

            >>> load_model_spec("model_zoo", "digits.digits_cnn").check()
        """
        optimizer = self._call("optimizer", self.optimizer)
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise self._wrong_return("optimizer", "a keras.optimizers.Optimizer", optimizer)
        try:
            check_optimizer(optimizer)
        except ModelSpecError as exc:
            raise ModelSpecError(f"Model module '{self.module_name}': {exc}") from exc

        model_fn = getattr(self.custom_model, "__name__", "custom_model")
        model = self._call(model_fn, self.custom_model)
        if not isinstance(model, keras.Model):
            raise self._wrong_return(model_fn, "a keras.Model", model)

        if self.eval_metrics_fn is not None:
            metrics = self._call("eval_metrics_fn", self.eval_metrics_fn)
            if not (
                isinstance(metrics, Mapping)
                and all(isinstance(name, str) for name in metrics)
                and all(
                    isinstance(m, keras.metrics.Metric) or callable(m) for m in metrics.values()
                )
            ):
                raise self._wrong_return(
                    "eval_metrics_fn",
                    "a dict of {name: keras metric or fn(labels, predictions)}",
                    metrics,
                )

        if self.callbacks is not None:
            callbacks = self._call("callbacks", self.callbacks)
            if not isinstance(callbacks, (list, tuple)):
                raise self._wrong_return("callbacks", "a list of callbacks", callbacks)

    def minibatches(self, records, mode, metadata, minibatch_size):
        """Minibatches of `records` through the module's input function, checked against the
        contract: `batch_dataset_fn` over minibatches of raw records where the module defines
        it, else `dataset_fn` over each record, then batched.

        Args:
            records: a `tf.data.Dataset` of serialized records, one scalar string per element.
            mode: a `Mode`.
            metadata: the record file's `Metadata`.
            minibatch_size: records per minibatch.

        Returns:
            A `tf.data.Dataset` of minibatches.

        Raises:
            ModelSpecError: the function returned no `tf.data.Dataset`, or one whose elements
                break the contract (see `apply_dataset_fn`); `batch_dataset_fn`, one whose
                elements hold a scalar (no row per record).
        """
        if self.batch_dataset_fn is None:
            return self.apply_dataset_fn(records, mode, metadata).batch(minibatch_size)
        return self.apply_batch_dataset_fn(records.batch(minibatch_size), mode, metadata)

    def apply_batch_dataset_fn(self, minibatches, mode, metadata):
        """`batch_dataset_fn(minibatches, mode, metadata)`, checked as `minibatches` says."""
        import tensorflow as tf

        name = "batch_dataset_fn"
        returned = self._checked(name, self.batch_dataset_fn(minibatches, mode, metadata), mode)
        scalars = [s for s in tf.nest.flatten(returned.element_spec)
                   if getattr(s.shape, "rank", None) == 0]
        if scalars:
            raise ModelSpecError(
                f"{self._call_text(name, mode)} must yield minibatches, a row per record of "
                f"the minibatch of records it is given. Received: a dataset whose elements "
                f"hold a scalar ({scalars[0]})")
        return returned

    def apply_dataset_fn(self, dataset, mode, metadata):
        """`dataset_fn(dataset, mode, metadata)`, checked against the contract.

        Returns:
            The `tf.data.Dataset` it returned.

        Raises:
            ModelSpecError: it returned no `tf.data.Dataset`, or, in a mode other than
                prediction, one whose elements are not `(features, labels)` pairs (in
                prediction: tuples of more than 3).
        """
        return self._checked("dataset_fn", self.dataset_fn(dataset, mode, metadata), mode)

    def _call_text(self, name, mode):
        return f"Model module '{self.module_name}': `{name}(dataset, mode='{mode}', metadata)`"

    def _checked(self, name, returned, mode):
        """`returned`, what the input function `name` returned, if it keeps the contract."""
        import tensorflow as tf  # the master's and the CLI's imports stay light

        call = self._call_text(name, mode)
        if not isinstance(returned, tf.data.Dataset):
            raise ModelSpecError(f"{call} must return a tf.data.Dataset. "
                                 f"Received: {_describe(returned)}")
        elements = returned.element_spec
        if mode != Mode.PREDICTION and not (isinstance(elements, tuple) and len(elements) == 2):
            raise ModelSpecError(
                f"{call} must return a dataset of (features, labels) pairs (features alone "
                f"only in mode 'prediction'). Received: a dataset of "
                f"{_describe_elements(elements)}"
            )
        if mode == Mode.PREDICTION and isinstance(elements, tuple) and len(elements) > 3:
            raise ModelSpecError(
                f"{call} must return a dataset of features, (features,), (features, labels) "
                "or (features, labels, sample_weights), as Keras's predict reads them (a "
                "model with a tuple of inputs: ((x1, x2),)). Received: a dataset of "
                f"{_describe_elements(elements)}")
        return returned

    def check_loss(self, loss):
        """Raises `ModelSpecError` unless `loss`, what `loss(labels, predictions)` returned,
        is a scalar (a loss whose rank is unknown while tracing passes: its shape shows only
        when it runs).

        Example:

            >>> spec.check_loss(tf.constant([0.5, 0.25]))  # doctest: +SKIP
            ModelSpecError: ... Received: a tensor of shape (2,)
        """
        shape = getattr(loss, "shape", ())
        rank = shape.rank if hasattr(shape, "rank") else len(shape)
        if rank:
            raise ModelSpecError(
                f"Model module '{self.module_name}': `loss(labels, predictions)` must return a "
                "scalar, the minibatch's loss (e.g. tf.reduce_mean of the per-example losses); "
                f"it is not averaged for you. Received: a tensor of shape {tuple(shape)}"
            )

    def _call(self, name, fn):
        try:
            return fn()
        except Exception as exc:
            raise ModelSpecError(
                f"Model module '{self.module_name}': `{name}()` must run without error. "
                f"Received: {type(exc).__name__}: {exc}"
            ) from exc

    def _wrong_return(self, name, expected, value):
        return ModelSpecError(
            f"Model module '{self.module_name}': `{name}()` must return {expected}. "
            f"Received: {_describe(value)}"
        )


def _describe_elements(elements):
    """What a dataset's `element_spec` holds, in a few words."""
    if isinstance(elements, tuple):
        return f"tuples of {len(elements)}"
    if isinstance(elements, dict):
        return f"dicts with keys {sorted(elements)}"
    if hasattr(elements, "shape") and hasattr(elements, "dtype"):
        return f"single {elements.dtype.name} tensors of shape {tuple(elements.shape)}"
    return type(elements).__name__


def check_model_spec(spec: ModelSpec) -> None:
    """Same as `spec.check()`, for callers that prefer a function."""
    spec.check()


# (attribute, how the contract writes it, number of positional arguments it is called with)
_REQUIRED = (
    ("loss", "loss(labels, predictions)", 2),
    ("optimizer", "optimizer()", 0),
)
_DATASET_FN = ("dataset_fn", "dataset_fn(dataset, mode, metadata)", 3)
_FEED_ALIAS = "feed"
_BATCH_DATASET_FN = ("batch_dataset_fn", "batch_dataset_fn(dataset, mode, metadata)", 3)
_OPTIONAL = (
    ("eval_metrics_fn", "eval_metrics_fn()", 0),
    ("callbacks", "callbacks()", 0),
)
_PROCESSOR = "PredictionOutputsProcessor"


def load_model_spec(model_zoo: str, model_def: str) -> ModelSpec:
    """Imports the model-zoo module that `model_def` names and collects its functions.

    Args:
        model_zoo: the directory `model_def` is relative to (see
            `module_loader.import_model_module`).
        model_def: `"module"`, `"pkg.module"`, `"pkg.module.fn"` (a model function other
            than `custom_model`) or the path of a `.py` file.

    Returns:
        The module's `ModelSpec`. Call its `check()` to also build the model and optimizer.

    Raises:
        ModelSpecError: the module cannot be imported (see
            `module_loader.import_model_module`), or a required name (`custom_model` or the
            named function, `loss`, `optimizer`, and `dataset_fn`, its alias `feed` or
            `batch_dataset_fn`) is missing, not callable or takes the wrong number of
            arguments; or an optional name (`eval_metrics_fn`, `callbacks`,
            `PredictionOutputsProcessor`) is defined but unusable.

    Example:

        >>> spec = load_model_spec("model_zoo", "mnist.mnist_functional")
        >>> spec.module_name
        'mnist.mnist_functional'
    """
    module, label, model_fn = import_model_module(model_zoo, model_def)
    return _spec_from_module(module, label, model_fn)


def _spec_from_module(module, label, model_fn):
    batch_dataset_fn = _optional(module, label, *_BATCH_DATASET_FN)
    if hasattr(module, _DATASET_FN[0]) or not hasattr(module, _FEED_ALIAS):
        dataset_fn = None
        if batch_dataset_fn is None or hasattr(module, _DATASET_FN[0]):
            dataset_fn = _required(module, label, *_DATASET_FN, alias=_FEED_ALIAS)
    else:
        dataset_fn = _required(
            module, label, _FEED_ALIAS, "feed(dataset, mode, metadata)", 3
        )
    processor = getattr(module, _PROCESSOR, None)
    if processor is not None and not (
        inspect.isclass(processor) and callable(getattr(processor, "process", None))
    ):
        raise ModelSpecError(
            f"Model module '{label}' must define `{_PROCESSOR}` as a class with a method "
            f"`process(predictions, worker_id)`, or not at all. "
            f"Received: {_PROCESSOR} = {_describe(processor)}"
        )
    return ModelSpec(
        module_name=label,
        custom_model=_required(module, label, model_fn, f"{model_fn}()", 0),
        loss=_required(module, label, *_REQUIRED[0]),
        optimizer=_required(module, label, *_REQUIRED[1]),
        dataset_fn=dataset_fn,
        eval_metrics_fn=_optional(module, label, *_OPTIONAL[0]),
        callbacks=_optional(module, label, *_OPTIONAL[1]),
        prediction_outputs_processor=processor,
        batch_dataset_fn=batch_dataset_fn,
    )


def _required(module, label, name, signature, num_args, alias=None):
    if not hasattr(module, name):
        also = (f" (or its alias `{alias}`, or `{_BATCH_DATASET_FN[1]}`)" if alias
                else "")
        raise ModelSpecError(
            f"Model module '{label}' does not define `{signature}`{also}, which the model-zoo "
            f"contract requires. Received: a module ({module_origin(module)}) without `{name}`"
        )
    return _callable(module, label, name, signature, num_args)


def _optional(module, label, name, signature, num_args):
    if getattr(module, name, None) is None:
        return None
    return _callable(module, label, name, signature, num_args)


def _callable(module, label, name, signature, num_args):
    value = getattr(module, name)
    if not callable(value):
        raise ModelSpecError(
            f"Model module '{label}' must define a callable `{signature}`. "
            f"Received: {name} = {_describe(value)}"
        )
    try:
        parameters = inspect.signature(value)
    except (TypeError, ValueError):  # Some builtins and C callables have no signature.
        return value
    try:
        parameters.bind(*([None] * num_args))
    except TypeError:
        raise ModelSpecError(
            f"Model module '{label}' must define `{signature}`, callable with {num_args} "
            f"positional argument{'' if num_args == 1 else 's'}. "
            f"Received: {name}{parameters}"
        ) from None
    return value


def _describe(value):
    text = repr(value)
    if len(text) > 200:
        text = text[:197] + "..."
    return f"{text} ({type(value).__name__})"
