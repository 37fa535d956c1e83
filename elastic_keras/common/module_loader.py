"""Importing a model-zoo module by the name or path `--model-def` gives it.

`import_model_module` finds the module under `--model-zoo` (or the `.py` file a path names),
puts its directory first on `sys.path` so that it may import its siblings, imports it, and
says which function builds the model. It imports only: whether the module keeps the
model-zoo contract is `model_spec`'s to check.

Example:

    >>> found = import_model_module("model_zoo", "mnist.mnist_functional")
    >>> found.label, found.model_fn
    ('mnist.mnist_functional', 'custom_model')
"""

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple

from elastic_keras.common.errors import ModelSpecError


class ModelModule(NamedTuple):
    """An imported model-zoo module.

    Attributes:
        module: the module object.
        label: the module as the user named it: a dotted name relative to the model zoo, or
            the path of a `.py` file. Error messages use it.
        model_fn: the name of its function that builds the model (`custom_model` unless
            `--model-def` named another).
    """

    module: Any
    label: str
    model_fn: str


def import_model_module(model_zoo: str, model_def: str) -> ModelModule:
    """Imports the model-zoo module that `model_def` names.

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

    Raises:
        ModelSpecError: `model_def` is malformed, `model_zoo` is not a directory, the module
            is not found there, it fails to import (the original exception is chained), or
            the function `pkg.module.fn` names does not exist.
    """
    if not isinstance(model_def, str) or not model_def.strip():
        raise ModelSpecError(
            "--model-def must name a module ('pkg.module'), a model function "
            f"('pkg.module.fn') or a .py file. Received: model_def={model_def!r}"
        )
    model_def = model_def.strip()
    if model_def.endswith(".py") or "/" in model_def or os.sep in model_def:
        module, label = _import_file(model_zoo, model_def)
        return ModelModule(module, label, "custom_model")
    return ModelModule(*_import_dotted(model_zoo, model_def))


def module_origin(module):
    """Where `module` was loaded from, for error messages."""
    return getattr(module, "__file__", None) or "no file"


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
            f"({module_origin(module)}) has no attribute `{model_fn}`"
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
