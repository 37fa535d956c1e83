"""The worker: takes tasks from the master, trains against the parameter servers."""
