"""What was trained of each epoch: record coverage, records done, lost tasks and timing.

The task queue writes into it as workers report; the job summary reads `counts()`.
Not locked: the `TaskManager` that owns it calls it under its own lock.
"""

import collections
import time

from elastic_keras.master.coverage import Coverage
from elastic_keras.master.tasks import EpochCounts


class EpochLedger:
    """Per epoch: which records each task attempt trained, how many records are done, how
    many training tasks were lost with their worker, and when its training began and ended.

    Args:
        num_epochs: epochs of the job.
        records_per_epoch: training records in one epoch.
    """

    def __init__(self, num_epochs, records_per_epoch):
        self.records_per_epoch = records_per_epoch
        self.coverage = [Coverage() for _ in range(num_epochs)]
        self.done_records = [0] * num_epochs
        self.lost = collections.Counter()  # epoch -> training tasks lost with their worker
        self._span = {}  # epoch -> [first training task handed out, training done]

    def began(self, epoch):
        """The epoch's first training task was handed out (in this run)."""
        if epoch not in self._span:
            self._span[epoch] = [time.monotonic(), None]

    def ended(self, epoch):
        """The epoch's last training task is done."""
        self._span[epoch][1] = time.monotonic()

    def trained(self, task, records_done):
        """Training task `task` is `records_done` records into its range."""
        self.coverage[task.epoch].add(task.path, task.task_id, task.start,
                                      task.start + records_done)

    def restored(self, epoch, done_records, coverage, lost):
        """Takes over an earlier run's ledger; the current `epoch` began in that run, so its
        training time is not measured."""
        self.done_records = list(done_records)
        self.coverage = list(coverage)
        self.lost = collections.Counter(lost)
        self._span = {epoch: [None, None]}

    def counts(self):
        """`[EpochCounts]`, one per epoch."""
        result = []
        for epoch, coverage in enumerate(self.coverage):
            once, more = coverage.counts()
            span = self._span.get(epoch, [None, None])
            seconds = None if None in span else round(span[1] - span[0], 3)
            result.append(EpochCounts(epoch, self.records_per_epoch, once, more, seconds,
                                      self.lost[epoch]))
        return result
