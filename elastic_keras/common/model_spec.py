"""Loading and checking a user's model-zoo module (ARCHITECTURE.md, "Model-zoo contract").

`load_model_spec` imports the module that `--model-def` names and collects the functions the
contract asks for into a `ModelSpec`, rejecting a missing or non-callable name at once.
`ModelSpec.check` goes one step further and calls `optimizer()` and `custom_model()` to see
that they return what they must; it is a separate step because building a model costs time
and leaves layers in Keras' global state, which the caller may want to clear afterwards.

Example:

    >>> spec = load_model_spec("model_zoo", "mnist.mnist_functional")
    >>> spec.check()
    >>> spec.dataset_fn(dataset, Mode.TRAINING, metadata)  # doctest: +SKIP
"""

import dataclasses
import enum
import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import keras

from elastic_keras.common.errors import ModelSpecError
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
            is `"prediction"`.
        eval_metrics_fn: `eval_metrics_fn()`, which returns `{name: metric}`; None if the module
            does not define it.
        callbacks: `callbacks()`, which returns a list of callbacks; None if absent.
        prediction_outputs_processor: the module's `PredictionOutputsProcessor` class, whose
            instances have `process(predictions, worker_id)`; None if absent.
    """

    module_name: str
    custom_model: Callable[[], Any]
    loss: Callable[[Any, Any], Any]
    optimizer: Callable[[], Any]
    dataset_fn: Callable[[Any, str, Any], Any]
    eval_metrics_fn: Callable[[], Any] | None = None
    callbacks: Callable[[], Any] | None = None
    prediction_outputs_processor: type | None = None

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
_OPTIONAL = (
    ("eval_metrics_fn", "eval_metrics_fn()", 0),
    ("callbacks", "callbacks()", 0),
)
_PROCESSOR = "PredictionOutputsProcessor"


def load_model_spec(model_zoo: str, model_def: str) -> ModelSpec:
    """Imports the model-zoo module that `model_def` names and collects its functions.

    Args:
        model_zoo: the directory `model_def` is relative to. It goes first on `sys.path`, so
            the module may import its siblings.
        model_def: one of
            - `"module"` or `"pkg.module"`: a module under `model_zoo`, imported as a package
              module so that relative imports (`from .common import ...`) work. Its model
              function is `custom_model`.
            - `"pkg.module.fn"`: where `pkg.module.fn` is not itself a module, the callable
              `fn` of module `pkg.module` is the model function instead of `custom_model`.
            - a path to a `.py` file, absolute or relative to `model_zoo` (or, failing that,
              to the current directory). A file inside a package (its folder has an
              `__init__.py`) is imported by its dotted name from above the outermost such
              folder; any other file is loaded under a unique module name, with its folder on
              `sys.path`.

    Returns:
        The module's `ModelSpec`. Call its `check()` to also build the model and optimizer.

    Raises:
        ModelSpecError: `model_zoo` is not a directory, the module is not found there, it
            fails to import (the original exception is chained), or a required name
            (`custom_model` or the named function, `loss`, `optimizer`, `dataset_fn` or its
            alias `feed`) is missing, not callable or takes the wrong number of arguments; or
            an optional name (`eval_metrics_fn`, `callbacks`, `PredictionOutputsProcessor`) is
            defined but unusable.

    Example:

        >>> spec = load_model_spec("model_zoo", "mnist.mnist_functional")
        >>> spec.module_name
        'mnist.mnist_functional'
    """
    if not isinstance(model_def, str) or not model_def.strip():
        raise ModelSpecError(
            "--model-def must name a module ('pkg.module'), a model function "
            f"('pkg.module.fn') or a .py file. Received: model_def={model_def!r}"
        )
    model_def = model_def.strip()
    if model_def.endswith(".py") or "/" in model_def or os.sep in model_def:
        module, label = _import_file(model_zoo, model_def)
        model_fn = "custom_model"
    else:
        module, label, model_fn = _import_dotted(model_zoo, model_def)
    return _spec_from_module(module, label, model_fn)


def _import_dotted(model_zoo, model_def):
    """Imports `model_def` from `model_zoo`; returns (module, its name, model function name)."""
    if not all(part.isidentifier() for part in model_def.split(".")):
        raise ModelSpecError(
            "--model-def must be a dotted Python name ('pkg.module' or 'pkg.module.fn') or "
            f"a path to a .py file. Received: model_def={model_def!r}"
        )
    zoo = Path(model_zoo).expanduser().resolve()
    if not zoo.is_dir():
        raise ModelSpecError(
            f"--model-zoo must be the directory that holds --model-def '{model_def}'. "
            f"Received: model_zoo={str(model_zoo)!r} (no such directory: {zoo})"
        )
    _put_first_on_sys_path(zoo)
    _claim_top_level(model_def.split(".")[0], zoo, model_def)
    try:
        return _import_module(model_def, zoo), model_def, "custom_model"
    except ModuleNotFoundError as exc:
        if "." not in model_def or exc.name != model_def:
            raise _not_found(model_def, zoo, exc) from exc
    module_name, model_fn = model_def.rsplit(".", 1)
    try:
        module = _import_module(module_name, zoo)
    except ModuleNotFoundError as exc:
        raise _not_found(model_def, zoo, exc) from exc
    if not hasattr(module, model_fn):
        raise ModelSpecError(
            f"--model-def '{model_def}' names neither a module under {zoo} nor a model "
            f"function of module '{module_name}'. Received: module '{module_name}' "
            f"({_origin(module)}) has no attribute `{model_fn}`"
        )
    return module, module_name, model_fn


def _import_module(name, zoo):
    """`importlib.import_module(name)`, with errors raised by the module's code wrapped.

    A `ModuleNotFoundError` for `name` itself (or a package above it) passes through, so
    that the caller can tell "not there" from "there but broken".
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise
        raise _import_failed(name, f"--model-zoo {zoo}", exc) from exc
    except Exception as exc:
        raise _import_failed(name, f"--model-zoo {zoo}", exc) from exc


def _import_file(model_zoo, model_def):
    """Imports the `.py` file `model_def`; returns (module, the file's path as a label)."""
    path = Path(model_def).expanduser()
    tried = [path] if path.is_absolute() else [Path(model_zoo).expanduser() / path, path]
    found = next((p.resolve() for p in tried if p.is_file()), None)
    if found is None or found.suffix != ".py":
        raise ModelSpecError(
            "--model-def must name an existing .py file. "
            f"Received: model_def={model_def!r} (looked for {', '.join(map(str, tried))})"
        )
    label = str(found)
    _put_first_on_sys_path(found.parent)
    package_root = _package_root(found)
    if package_root is not None:
        dotted = ".".join(found.relative_to(package_root).with_suffix("").parts)
        module, _, _ = _import_dotted(package_root, dotted)
        return module, label

    stem = re.sub(r"\W", "_", found.stem)
    name = f"_elastic_keras_model_{stem}_{hashlib.sha1(label.encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(name, found)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise _import_failed(label, str(found), exc) from exc
    return module, label


def _package_root(path):
    """The folder above the outermost package that holds the file `path`, or None.

    None also when some folder or the file's name is not a Python identifier, so the file
    cannot be imported by a dotted name.
    """
    root = path.parent
    if not (root / "__init__.py").is_file():
        return None
    while (root.parent / "__init__.py").is_file() and root.parent != root:
        root = root.parent
    parts = path.relative_to(root.parent).with_suffix("").parts
    return root.parent if all(part.isidentifier() for part in parts) else None


def _put_first_on_sys_path(directory):
    entry = str(directory)
    if sys.path[:1] != [entry]:
        while entry in sys.path:
            sys.path.remove(entry)
        sys.path.insert(0, entry)
    importlib.invalidate_caches()


def _claim_top_level(top, zoo, model_def):
    """Checks that `zoo` holds `top`, and drops an imported `top` that is not that one.

    Two model zoos may both hold a `mnist` package; the one asked for must win over one an
    earlier load left in `sys.modules`.
    """
    found = importlib.machinery.PathFinder.find_spec(top, [str(zoo)])
    if found is None:
        raise ModelSpecError(
            f"--model-def '{model_def}' must name a module under --model-zoo {zoo}. "
            f"Received: no module or package '{top}' in {zoo}"
        )
    loaded = sys.modules.get(top)
    if loaded is None or _same_place(loaded, found):
        return
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        del sys.modules[name]


def _same_place(module, spec):
    file = getattr(module, "__file__", None)
    if file and spec.origin:
        return os.path.realpath(file) == os.path.realpath(spec.origin)
    locations = {os.path.realpath(p) for p in getattr(module, "__path__", [])}
    wanted = {os.path.realpath(p) for p in (spec.submodule_search_locations or [])}
    return bool(wanted) and wanted <= locations


def _spec_from_module(module, label, model_fn):
    if hasattr(module, _DATASET_FN[0]) or not hasattr(module, _FEED_ALIAS):
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
    )


def _required(module, label, name, signature, num_args, alias=None):
    if not hasattr(module, name):
        also = f" (or its alias `{alias}`)" if alias else ""
        raise ModelSpecError(
            f"Model module '{label}' does not define `{signature}`{also}, which the model-zoo "
            f"contract requires. Received: a module ({_origin(module)}) without `{name}`"
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


def _origin(module):
    return getattr(module, "__file__", None) or "no file"


def _describe(value):
    text = repr(value)
    if len(text) > 200:
        text = text[:197] + "..."
    return f"{text} ({type(value).__name__})"


def _import_failed(name, where, exc):
    return ModelSpecError(
        f"Model module '{name}' must import without error (from {where}). "
        f"Received: {type(exc).__name__}: {exc}"
    )


def _not_found(model_def, zoo, exc):
    return ModelSpecError(
        f"--model-def '{model_def}' must name a module under --model-zoo {zoo}. "
        f"Received: module '{exc.name}' not found"
    )
