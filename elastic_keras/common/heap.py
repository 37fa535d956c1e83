"""Python's cycle collector and the objects a process keeps for its whole life.

A role imports TensorFlow and Keras at start: hundreds of thousands of objects that live as
long as the process. The collector scans every one of them at each full collection: with
TensorFlow loaded such a scan took 0.15-0.3 s, several of them during the imports, one while
a worker built its model, and one more at exit (the interpreter's last collection, 1.1 s of
a role's exit). Objects frozen with `gc.freeze` are never scanned again; they are still
freed when nothing refers to them.
"""

import contextlib
import gc


@contextlib.contextmanager
def lifelong():
    """Makes what is created inside (the imports of a process's entry point) lifelong: the
    collector is off inside, and what is alive at the end is frozen out of its scans."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
