"""How a worker tells a failed task: one line and the frame of the user's code, and whether
a retry could help.

A TensorFlow error raised while tracing a step carries a whole traceback in its message
("in user code: File ..., line ..."); the master's log and `job_summary.json` get one line
instead: the error itself, and the last frame of the user's own code (the model module),
if any, as `file:line in function`. The full traceback stays in the worker's log.

Example:

    >>> describe(ValueError("in user code:\\n\\n    File \\"/zoo/m.py\\", line 12, in loss  *\\n"
    ...                     "        return x - y\\n\\n    ValueError: Dimensions must be equal"))
    'ValueError: Dimensions must be equal (at /zoo/m.py:12 in loss)'
"""

import os
import re
import sysconfig
import traceback

import grpc

from elastic_keras.common.errors import (
    MODEL_MODULE, NON_FINITE_LOSS, ElasticKerasError, ModelSpecError, NonFiniteLossError,
    PushRefused,
)

MAX_CHARS = 600


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARY_DIRS = tuple(
    os.path.abspath(d) for d in {sysconfig.get_path(n) for n in ("stdlib", "purelib", "platlib")}
    if d
)


def describe(exc):
    """`exc` in one line, with the frame of the user's code that raised it, if any."""
    name = type(exc).__name__
    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        name, message = "RpcError", f"{exc.code().name}: {exc.details()}"  # not the call
    else:
        message = str(exc).strip()
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if "in user code:" in message and lines:
        text = lines[-1]  # TensorFlow puts the original error last
    else:
        text = lines[0] if lines else ""
    if not text.startswith(f"{name}:"):
        text = f"{name}: {text}" if text else name
    frame = user_frame(exc, message)
    if frame and frame not in text:
        text = f"{text} (at {frame})"
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS - 3] + "..."


def user_frame(exc, message=None):
    """`file:line in function` of the innermost frame of user code that `exc` went through
    (in TensorFlow's "in user code" listing, else in the traceback), or ""."""
    listed = [(path, int(line), fn) for path, line, fn in
              _FRAME.findall(str(exc) if message is None else message)]
    traced = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(exc.__traceback__)]
    for frames in (listed, traced):
        found = [f for f in frames if _is_user_file(f[0])]
        if found:
            path, line, fn = found[-1]
            return f"{path}:{line} in {fn}"
    return ""


def _is_user_file(path):
    if not path or path.startswith("<") or "__autograph_generated" in path:
        return False
    path = os.path.abspath(path)
    return not (path.startswith(_PACKAGE_DIR + os.sep)
                or any(path.startswith(d + os.sep) for d in _LIBRARY_DIRS))


def fatal(exc, on_non_finite_loss="fail"):
    """What makes `exc` fail the job at once ("" if a retry could help):

    `MODEL_MODULE` for a `ModelSpecError` (the module breaks the contract: every attempt
    would), `NON_FINITE_LOSS` for a non-finite loss with `--on-non-finite-loss fail`.
    """
    if isinstance(exc, ModelSpecError):
        return MODEL_MODULE
    cause = exc.__cause__ if isinstance(exc, PushRefused) else exc
    if isinstance(cause, NonFiniteLossError) and on_non_finite_loss == "fail":
        return NON_FINITE_LOSS
    return ""


def is_told(exc):
    """Whether `exc` says all there is to say (a named error, or one in the user's code):
    the worker then logs its traceback at debug level only."""
    return isinstance(exc, ElasticKerasError) or bool(user_frame(exc))
