"""The master: task queue, membership, evaluation, job state, and the roles it launches."""
