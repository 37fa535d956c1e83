"""`elastic-keras`: train a model-zoo module; evaluate, predict with or export a checkpoint;
scale a running job or show its status; convert data.

Exit codes: 0 the job succeeded (scale: the master took the request); 1 it failed (scale:
the master could not be reached); 2 bad flags, model module, data or checkpoint directory
(nothing was launched); 130 interrupted.
"""

import argparse
import sys

from elastic_keras import __version__
from elastic_keras.common.log import quiet_native_logs

quiet_native_logs()

from elastic_keras.common import config as config_lib
from elastic_keras.common.errors import ConfigError
from elastic_keras.data import command as data_command


def build_parser():
    parser = argparse.ArgumentParser(
        prog="elastic-keras",
        description="Elastic parameter-server training of Keras models.",
    )
    parser.add_argument("--version", action="version", version=f"elastic-keras {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train = commands.add_parser(
        "train", help="Train a model-zoo module with parameter servers and workers.",
        description="Train a model-zoo module: the master launches --num-ps parameter "
        "servers and --num-workers workers as local processes and hands out tasks.",
    )
    config_lib.add_arguments(train, config_lib.JobConfig)
    train.set_defaults(func=_run_train)
    for name, (summary, description) in _CHECKPOINT_COMMANDS.items():
        command = commands.add_parser(name, help=summary, description=description)
        config_lib.add_arguments(command, config_lib.JobConfig)
        command.set_defaults(func=_run_train, job_type=name)
    scale = commands.add_parser(
        "scale", help="Change the number of workers of a running job.",
        description="Tell a running job's master how many workers to run from now on. New "
        "workers join at once; removed ones hand their task back and leave.",
    )
    scale.add_argument("--job-name", required=True, help="The --job-name of the running job.")
    scale.add_argument("--num-workers", required=True, type=int, metavar="N",
                       help="Workers to run from now on (at least 1).")
    scale.add_argument("--master-addr", default="", metavar="HOST:PORT",
                       help="The master's address (default: the one its master recorded on "
                       "this machine, with the job's credential).")
    scale.set_defaults(func=_run_scale)
    status = commands.add_parser(
        "status", help="Show a running job's status.",
        description="Print a running job's progress, workers, parameter servers, last "
        "evaluation and recent failures: what its status page shows.",
    )
    status.add_argument("--job-name", required=True, help="The --job-name of the running job.")
    status.add_argument("--json", action="store_true", help="Print the status as JSON.")
    status.add_argument("--url", default="", metavar="URL",
                        help="The job's status page (default: the one its master recorded "
                        "on this machine).")
    status.set_defaults(func=_run_status)
    data_command.register(commands)
    return parser


_CHECKPOINT_COMMANDS = {
    "evaluate": (
        "Evaluate a checkpoint on --validation-data with the module's eval_metrics_fn.",
        "Evaluate the model of --checkpoint-dir-for-init (several, or --ensemble last-K: an "
        "ensemble) on --validation-data with parameter servers and workers, at one model "
        "version; prints the metrics and writes OUTPUT/evaluation.json.",
    ),
    "predict": (
        "Predict --prediction-data with a checkpoint.",
        "Predict every record of --prediction-data exactly once with the model of "
        "--checkpoint-dir-for-init (several, or --ensemble last-K: an ensemble); predictions "
        "go to the module's PredictionOutputsProcessor, or to OUTPUT/predictions/*.jsonl.",
    ),
    "export": (
        "Export a checkpoint as a serving SavedModel.",
        "Write the model of --checkpoint-dir-for-init to OUTPUT/saved_model, the SavedModel "
        "training writes (embedding tables included), without training. A data flag is "
        "optional: its first records shape the input signature of a model that declares none.",
    ),
}


def _run_scale(args):
    import grpc

    from elastic_keras.common.master_client import MasterClient
    from elastic_keras.common.tls import TlsMaterial
    from elastic_keras.master import job_locator

    if args.num_workers < 1:
        print(f"elastic-keras scale: error: --num-workers must be at least 1. "
              f"Received: {args.num_workers}", file=sys.stderr)
        return 2
    try:
        entry = job_locator.find(args.job_name)  # the job's credential is recorded there
    except ConfigError as exc:
        print(f"elastic-keras scale: error: {exc} The job's credential is kept where its "
              "master runs: run this command on that machine, as its user.", file=sys.stderr)
        return 2
    address = args.master_addr or entry["address"]
    material = entry.get("tls") and TlsMaterial(
        entry["tls"]["ca"].encode(), entry["tls"]["cert"].encode(),
        entry["tls"]["key"].encode(), entry["tls"]["target_name"])
    client = MasterClient(address, deadline_s=10.0, token=entry.get("credential") or None,
                          tls=material or None)
    try:
        answer = client.scale(args.job_name, args.num_workers)
    except grpc.RpcError as exc:
        print(f"elastic-keras scale: error: the master of {args.job_name!r} at {address} "
              f"refused or did not answer: {exc.code().name}: {exc.details()}",
              file=sys.stderr)
        return 2 if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                                   grpc.StatusCode.FAILED_PRECONDITION) else 1
    finally:
        client.close()
    print(f"Job {answer.job_name}: workers {answer.previous_num_workers} -> "
          f"{answer.num_workers} ({answer.running_workers} running before the change)",
          file=sys.stderr)
    return 0


def _run_status(args):
    import json
    import urllib.error
    import urllib.request

    from elastic_keras.master import job_locator
    from elastic_keras.master.status_text import format_status

    url = args.url
    if not url:
        try:
            url = job_locator.find(args.job_name).get("status_url", "")
        except ConfigError as exc:
            print(f"elastic-keras status: error: {exc}", file=sys.stderr)
            return 2
        if not url:
            print(f"elastic-keras status: error: the master of {args.job_name!r} serves no "
                  "status page (--no-status-page, or its port was taken)", file=sys.stderr)
            return 2
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/status.json", timeout=10) as answer:
            snapshot = json.load(answer)
    except (OSError, ValueError) as exc:
        print(f"elastic-keras status: error: {url} did not answer: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(snapshot, indent=2) if args.json else format_status(snapshot))
    return 0


def _run_train(args):
    if args.job_type != args.command:
        print(f"elastic-keras {args.command}: error: --job-type {args.job_type} contradicts "
              f"the command; run elastic-keras {args.job_type} instead", file=sys.stderr)
        return 2
    if args.engine == "kubernetes":  # the master runs in a pod: submit it
        from elastic_keras.master.kubernetes_submit import submit_command
        try:
            return submit_command(config_lib.from_namespace(config_lib.JobConfig, args))
        except ConfigError as exc:
            print(f"elastic-keras {args.job_type}: error: {exc}", file=sys.stderr)
            return 2
    from elastic_keras.master.main import train_command  # loads TensorFlow: only to run

    return train_command(args, f"elastic-keras {args.job_type}")


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(config_lib.normalize_flags(sys.argv[1:] if argv is None else argv))
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
