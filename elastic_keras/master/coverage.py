"""Counts how many times each record of an epoch was trained, from ranges of records."""

import collections


class Coverage:
    """The record ranges trained in one epoch, kept per task attempt.

    Each attempt trains a growing prefix [start, reached) of its range; `add` records how far
    it got. `counts()` then tells how many records were trained at least once and more than
    once, without keeping anything per record.
    """

    def __init__(self):
        self._reached = collections.defaultdict(dict)  # path -> {attempt: (start, end)}

    def add(self, path, attempt_id, start, end):
        """Attempt `attempt_id` on `path` has trained records [start, end)."""
        ranges = self._reached[path]
        old = ranges.get(attempt_id)
        if old is None or end > old[1]:
            ranges[attempt_id] = (start, end)

    def counts(self):
        """(records trained at least once, records trained more than once)."""
        once = more = 0
        for ranges in self._reached.values():
            events = []
            for start, end in ranges.values():
                if end > start:
                    events += [(start, 1), (end, -1)]
            events.sort()
            depth, last = 0, None
            for position, delta in events:
                if last is not None and depth > 0:
                    once += position - last
                    if depth > 1:
                        more += position - last
                depth += delta
                last = position
        return once, more
