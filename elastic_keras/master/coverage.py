"""Counts how many times each record of an epoch was trained, from ranges of records."""

import collections


class Coverage:
    """The record ranges trained in one epoch, kept per task attempt.

    Each attempt trains a growing prefix [start, reached) of its range; `add` records how far
    it got. `counts()` then tells how many records were trained at least once and more than
    once, without keeping anything per record. `state()` and `from_state()` carry that across
    a restart of the master.

    Example:
        coverage = Coverage()
        coverage.add("a.tfrecord", 1, 0, 10)
        coverage.add("a.tfrecord", 2, 5, 12)
        coverage.counts()  # (12, 5)
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
        for path in self._reached:
            for start, end, times in self._segments(path):
                once += end - start
                if times > 1:
                    more += end - start
        return once, more

    def state(self):
        """`{path: [[start, end, times], ...]}`, JSON-serialisable; `times` is 1, or 2 for
        "more than once" (all that `counts()` tells apart)."""
        state = {}
        for path in self._reached:
            segments = []
            for start, end, times in self._segments(path):
                times = min(times, 2)
                if segments and segments[-1][1] == start and segments[-1][2] == times:
                    segments[-1][1] = end
                else:
                    segments.append([start, end, times])
            if segments:
                state[path] = segments
        return state

    @classmethod
    def from_state(cls, state):
        """The coverage that `state()` described; later `add`s count on top of it."""
        coverage = cls()
        for path, segments in state.items():
            ranges = coverage._reached[path]
            for start, end, times in segments:
                for copy in range(times):
                    # Tuple keys: never equal to the integer ids of live attempts.
                    ranges[("restored", len(ranges), copy)] = (int(start), int(end))
        return coverage

    def _segments(self, path):
        """(start, end, times) of the stretches of `path` trained a constant number of times."""
        events = []
        for start, end in self._reached[path].values():
            if end > start:
                events += [(start, 1), (end, -1)]
        events.sort()
        depth, last = 0, None
        for position, delta in events:
            if last is not None and depth > 0 and position > last:
                yield last, position, depth
            depth += delta
            last = position
