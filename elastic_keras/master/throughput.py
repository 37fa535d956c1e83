"""Training loss and examples per second, as reported by workers."""

import collections
import math
import threading
import time


class Throughput:
    """Smoothed loss and examples/s over a sliding window of worker reports."""

    def __init__(self, window_s=10.0):
        self._window_s = window_s
        self._lock = threading.Lock()
        self._events = collections.deque()  # (time, records)
        self.loss = None
        self.records = 0
        self._first = None
        self._epoch = [0.0, 0]  # loss x records, records: since `take_epoch_loss`

    def add(self, records, loss=None):
        """Adds `records` newly trained examples and their mean `loss`."""
        now = time.monotonic()
        with self._lock:
            if self._first is None:
                self._first = now
            if records > 0:
                self._events.append((now, records))
                self.records += records
            if loss is not None and math.isfinite(loss):  # a NaN or Inf says nothing
                self.loss = loss if self.loss is None else 0.8 * self.loss + 0.2 * loss
                if records > 0:
                    self._epoch[0] += loss * records
                    self._epoch[1] += records

    def take_epoch_loss(self):
        """The mean training loss over the records added since the last call (None: none),
        and starts counting anew."""
        with self._lock:
            total, records = self._epoch
            self._epoch = [0.0, 0]
        return total / records if records else None

    def examples_per_second(self):
        now = time.monotonic()
        with self._lock:
            while self._events and self._events[0][0] < now - self._window_s:
                self._events.popleft()
            if not self._events or self._first is None:
                return 0.0
            span = min(self._window_s, max(now - self._first, 1e-3))
            return sum(r for _, r in self._events) / span
