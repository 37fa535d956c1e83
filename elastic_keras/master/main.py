"""The master's entry points: `python -m elastic_keras.master [train flags]`, the
`elastic-keras train` command and `elastic_keras.train()` all end in `run_job`.

Exit codes of `main`: 0 the job succeeded; 1 it failed; 2 bad flags, model module, data or
checkpoint directory (nothing was launched, or a worker found the module breaking the
contract at its first step: the job failed at once); 130 interrupted (Ctrl-C or SIGTERM).
"""

import argparse
import json
import logging
import signal
import sys
import threading

from elastic_keras.common import config as config_lib
from elastic_keras.common.errors import ConfigError, DataError, ModelSpecError
from elastic_keras.common.log import LOG_FORMAT, setup_logging
from elastic_keras.common.model_spec import check_model_spec, load_model_spec
from elastic_keras.master import instance_manager
from elastic_keras.master.console import Console, ConsoleHandler
from elastic_keras.master.master import Master
from elastic_keras.master.summary import JobStatus

EXIT_CODES = {JobStatus.SUCCEEDED: 0, JobStatus.FAILED: 1, JobStatus.INTERRUPTED: 130}


def main(argv=None):
    """`python -m elastic_keras.master`: the flags of `elastic-keras train`."""
    parser = argparse.ArgumentParser(prog="python -m elastic_keras.master",
                                     description="Run a training job's master.")
    config_lib.add_arguments(parser, config_lib.JobConfig)
    argv = sys.argv[1:] if argv is None else argv
    return train_command(parser.parse_args(config_lib.normalize_flags(argv)), "master")


def train_command(args, prog="elastic-keras train"):
    """Runs the job the parsed flags `args` describe, prints its summary; the exit code."""
    try:
        summary = run_job(config_lib.from_namespace(config_lib.JobConfig, args))
    except (ConfigError, ModelSpecError, DataError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return EXIT_CODES[JobStatus.INTERRUPTED]
    print_summary(summary)
    return EXIT_CODES[summary.status]


def run_job(config):
    """Loads and checks the model module, then runs the job to its end; its `JobSummary`.

    Raises:
        ConfigError, ModelSpecError, DataError: before anything is launched; ModelSpecError
            also once the job failed because a worker found the module breaking the contract
            (its summary is written).
    """
    instance_manager.engine_type(config.engine)  # a bad --engine: before anything loads
    spec = load_model_spec(config.model_zoo, config.model_def)
    check_model_spec(spec)
    console = Console(show_role_info=config.log_level == "debug")
    setup_logging(config.log_level)
    root = logging.getLogger()
    root.handlers = [ConsoleHandler(console)]
    root.handlers[0].setFormatter(logging.Formatter(LOG_FORMAT))
    master = Master(config, spec, console=console)
    with _sigterm_as_interrupt():
        summary = master.run()
    master.reports.raise_for_bad_module(summary.error)
    return summary


def print_summary(summary, stream=None):
    lines = [f"Job {summary.job_name} {summary.status.value.upper()}"]
    if summary.error:
        lines.append(f"  error: {summary.error}")
    if summary.job_type != "train":
        lines += _outputs_lines(summary)
        print("\n".join(lines), file=stream or sys.stderr)
        return
    for epoch in summary.epochs:
        lines.append(
            f"  epoch {epoch['epoch']}: {epoch['trained_at_least_once']}/{epoch['records']} "
            f"records trained, {epoch['trained_more_than_once']} more than once"
        )
    if summary.stopped_early:
        lines.append(f"  stopped early after epoch {summary.stopped_early} by a callback")
    for evaluation in summary.evaluations[-1:]:
        lines.append(f"  evaluation (version {evaluation['model_version']}): "
                     f"{json.dumps(evaluation['metrics'])}")
    lines.append(
        f"  tasks: {summary.tasks_done} done, {summary.tasks_failed} failed, "
        f"{summary.tasks_requeued} re-queued; model version {summary.final_model_version}"
    )
    lines.append(f"  {summary.examples_trained} examples in {summary.training_time_s:.1f} s "
                 f"({summary.examples_per_second:.0f} examples/s); wall time "
                 f"{summary.wall_time_s:.1f} s")
    if summary.saved_model:
        lines.append(f"  model: {summary.saved_model}")
    print("\n".join(lines), file=stream or sys.stderr)


def _outputs_lines(summary):
    outputs = summary.outputs
    lines = [f"  {summary.job_type} of {', '.join(outputs.get('checkpoints', [])) or '-'} "
             f"(model version {summary.final_model_version})"]
    for evaluation in summary.evaluations[-1:]:
        lines.append(f"  metrics: {json.dumps(evaluation['metrics'])}")
    if summary.job_type != "export":
        lines.append(f"  {outputs.get('records', 0)} records in {summary.wall_time_s:.1f} s"
                     + (f"; predictions: {outputs['predictions']}"
                        if "predictions" in outputs else ""))
    if summary.saved_model:
        lines.append(f"  model: {summary.saved_model}")
    return lines


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
