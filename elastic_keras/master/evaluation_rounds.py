"""The evaluation-round state machine of the task queue.

`TaskManager.start_evaluation` opens a round over the validation data, at the end of an epoch
or mid-epoch. While it is open no training task is handed out, and its evaluation tasks are
handed out only once no training task runs: with asynchronous training too, every evaluation
task sees the same model. `elastic-keras predict` runs one round of prediction tasks instead.
"""

from elastic_keras.master.tasks import EvalRound, TaskType


class EvaluationRounds:
    """The open round, its tasks waiting, and whether this epoch's closing round has run.

    Not locked: the `TaskManager` that owns it calls it under its own lock.

    Args:
        ranges: `[(path, start, end)]` of the validation data, one task each.
        task_type: the `TaskType` of a round's tasks (PREDICTION for a prediction job).
    """

    def __init__(self, ranges, task_type=TaskType.EVALUATION):
        self.ranges = list(ranges)
        self.task_type = task_type
        self.open_round = None       # the open EvalRound
        self.waiting = []            # its evaluation tasks not handed out yet
        self.epoch_evaluated = False  # the epoch's end-of-epoch round has ended

    def start(self, epoch, model_version, end_of_epoch, new_task, training):
        """Opens a round (see `TaskManager.start_evaluation`) whose tasks `new_task(type,
        path, start, end, epoch, version=...)` makes; returns whether one is open for it.

        Args:
            training: (training tasks waiting, running) of the epoch.

        Raises:
            ValueError: `end_of_epoch` while the epoch still has training to do.
        """
        if not self.ranges or self.epoch_evaluated:
            return False
        if end_of_epoch and any(training):
            raise ValueError(
                f"end_of_epoch=True needs epoch {epoch}'s training to be complete; Received: "
                f"end_of_epoch=True with {training[0]} training tasks waiting and "
                f"{training[1]} running"
            )
        if self.open_round is not None:
            if end_of_epoch:  # the round already open closes the epoch
                self.open_round = self.open_round._replace(end_of_epoch=True)
            return end_of_epoch
        self.open_round = EvalRound(epoch, model_version, end_of_epoch)
        self.waiting = [new_task(self.task_type, *r, epoch, version=model_version)
                        for r in self.ranges]
        return True

    def next_task(self, training_running):
        """The next evaluation task, or None: the round's barrier holds them back while a
        training task runs."""
        if training_running or not self.waiting:
            return None
        return self.waiting.pop(0)

    def finish(self, evaluating, training_complete):
        """The round that just ended (once), or None while tasks of it wait or run.

        A round ends with `end_of_epoch=True` when it was opened so, or when the epoch's
        training was complete by the time it ran: it evaluated the end-of-epoch model.
        """
        if self.open_round is None or self.waiting or evaluating:
            return None
        finished, self.open_round = self.open_round, None
        if not finished.end_of_epoch and training_complete:
            finished = finished._replace(end_of_epoch=True)
        self.epoch_evaluated = finished.end_of_epoch
        return finished
