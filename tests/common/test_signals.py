"""set_from_handler: a signal handler may run while its thread holds the event's lock."""

import os
import signal
import threading

from elastic_keras.common.signals import set_from_handler


def test_an_event_is_set_even_when_its_thread_holds_its_lock():
    event = threading.Event()
    with event._cond:  # where Event.wait holds it, and where a plain set() would never return
        set_from_handler(event)
        assert not event.is_set()
    assert event.wait(10)


def test_a_signal_handler_sets_the_event():
    event = threading.Event()
    previous = signal.signal(signal.SIGUSR1, lambda *_: set_from_handler(event))
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert event.wait(10)
    finally:
        signal.signal(signal.SIGUSR1, previous)
