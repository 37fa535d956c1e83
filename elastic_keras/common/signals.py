"""Acting on a signal from its handler without deadlocking.

Python runs a signal handler in the main thread between bytecodes, possibly while that thread
holds a lock: inside `threading.Event.wait`, say, which holds the event's lock around its
blocking wait. A handler that calls `event.set()` then waits for a lock its own thread holds,
for ever. `set_from_handler` sets the event from a thread of its own instead.
"""

import threading


def set_from_handler(event):
    """Sets `event` soon, safely from a signal handler."""
    threading.Thread(target=event.set, name="signal", daemon=True).start()
