"""Starting a job from Python, for notebooks and pipelines.

Example:

    import elastic_keras

    summary = elastic_keras.train(
        model_zoo="model_zoo", model_def="mnist.mnist_functional",
        training_data="data/train", validation_data="data/test",
        num_workers=2, num_ps=1, minibatch_size=64, num_epochs=3, output="out",
    )
    print(summary.status, summary.evaluations[-1]["metrics"])
"""

import logging
import signal
import threading

from elastic_keras.common.config import JobConfig
from elastic_keras.common.log import LOG_FORMAT, setup_logging
from elastic_keras.common.model_spec import check_model_spec, load_model_spec
from elastic_keras.master.console import Console, ConsoleHandler
from elastic_keras.master.master import Master


def train(config=None, **flags):
    """Trains a model-zoo module with a master, parameter servers and workers.

    The roles run as local subprocesses; this call returns when the job has ended.

    Args:
        config: a `JobConfig`; or leave it out and pass its fields as keyword arguments
            (`model_def=..., training_data=..., num_workers=...`: the `elastic-keras train`
            flags in snake_case).

    Returns:
        The `JobSummary` (also written to `output/job_summary.json` when `output` is set).

    Raises:
        ConfigError: a bad setting. ModelSpecError: a bad model module. DataError: data
        paths that match nothing or bad record files. Nothing has been launched then.
    """
    if config is None:
        config = JobConfig(**flags)
    elif flags:
        raise TypeError("train() takes a JobConfig or keyword flags, not both.")
    spec = load_model_spec(config.model_zoo, config.model_def)
    check_model_spec(spec)
    console = Console(show_role_info=config.log_level == "debug")
    setup_logging(config.log_level)
    root = logging.getLogger()
    root.handlers = [ConsoleHandler(console)]
    root.handlers[0].setFormatter(logging.Formatter(LOG_FORMAT))
    master = Master(config, spec, console=console)
    with _sigterm_as_interrupt():
        return master.run()


class _sigterm_as_interrupt:
    """Within the block, SIGTERM stops the job like Ctrl-C (main thread only)."""

    def __enter__(self):
        self._old = None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, _raise_interrupt)
        return self

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt
