"""`python -m bench {all,dense,sparse,micro,scaling,...} [--quick]`: runs benchmarks on
127.0.0.1, starting every process itself, and prints one JSON line per result.

Suites (see each module's docstring, and bench/README.md for the latest figures):

- dense: MNIST CNN and MLP, elastic_keras against Keras fit and ParameterServerStrategy
  (`bench/dense.py`);
- sparse: DeepFM on hashed tables, elastic_keras against ParameterServerStrategy and Keras
  fit (`bench/deepfm.py`);
- micro: PS dense push/pull against raw gRPC, embedding rows pulled and pushed against raw
  gRPC, codecs; the full run adds the in-process embedding table (`bench/transfer.py`,
  `bench/embedding_rows.py`, `bench/codec.py`, `bench/embedding_table.py`);
- scaling: examples/s as the tables grow and as workers are added (`bench/scaling.py`);
- all: the four above, in that order (under 30 minutes on 2 cores); `all --quick` leaves
  scaling out (under 5 minutes; `scaling --quick` runs alone in about a minute);
- recovery (not in all): seconds from a killed worker or parameter server to the job
  training again (`bench/recovery.py`; `--quick` in about two minutes);
- census (not in all): the census wide & deep job on the real Adult data (`bench/deepfm.py`);
- security (not in all): the same dense and sparse jobs with `--tls auto` and without
  (`bench/security.py`);
- engines (not in all): start-up and replacing a lost worker, local processes against the
  Kubernetes engine on the tests' fake cluster (`bench/engines.py`);
- lifecycle (not in all): a table under a row budget fed a stream of 20M new ids: memory
  and row throughput against the same table without a budget (`bench/lifecycle.py`);
- phases (not in all): where one worker's DeepFM step goes, per phase, on both ends of its
  calls (`bench/phases.py`).

Each part of micro also runs alone: codec, embedding_table, embedding_rows, and transfer
(every codec and transfer dtype, in ms and bytes on the wire, beside raw gRPC).
A suite that fails prints a line with `value: null` and an `error`, and the run goes on.
"""

import argparse
import tempfile
import time

from bench import (
    codec, dense, deepfm, embedding_rows, embedding_table, engines, lifecycle, phases,
    recovery, scaling, security, transfer,
)
from bench.common import attempt, emit, run_lines


def micro(quick, work_dir):
    """The micro-benchmarks, each part in a process of its own (so that its peak RSS is its
    own) and guarded, so that one failing leaves the others."""
    flags = ["--quick"] if quick else []
    parts = [("transfer", "--mb-per-s"), ("embedding_rows",), ("codec",)]
    if not quick:
        parts.append(("embedding_table",))
    for module, *args in parts:
        _, error = attempt(f"micro {module}", run_lines, f"bench.{module}", *args, *flags)
        if error:
            emit(f"{module}/run", {"args": args + flags}, None, None, None, error=error)


SUITES = {
    "dense": dense.run,
    "sparse": deepfm.run,
    "micro": micro,
    "scaling": scaling.run,
}
PARTS = {
    "recovery": lambda quick, work_dir: recovery.run(quick),
    "census": lambda quick, work_dir: deepfm.census(),
    "security": security.run,
    "engines": lambda quick, work_dir: engines.run(quick),
    "lifecycle": lifecycle.run,
    "phases": phases.run,
    "codec": codec.run,
    "embedding_table": embedding_table.run,
    "embedding_rows": embedding_rows.run,
    "transfer": transfer.run,
}


def main():
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", choices=["all", *SUITES, *PARTS])
    parser.add_argument("--quick", action="store_true",
                        help="fewer configurations and repeats (under 5 minutes on 2 cores)")
    args = parser.parse_args()
    if args.suite == "all":
        chosen = {n: r for n, r in SUITES.items() if not (args.quick and n == "scaling")}
    else:
        chosen = {args.suite: {**SUITES, **PARTS}[args.suite]}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-") as work_dir:
        for name, run in chosen.items():
            suite_started = time.perf_counter()
            _, error = attempt(f"suite {name}", run, args.quick, work_dir)
            emit(f"{name}/wall_time", {"quick": args.quick}, time.perf_counter() - suite_started,
                 "s", None, error=error)
    if len(chosen) > 1:
        emit("all/wall_time", {"quick": args.quick, "suites": list(chosen)},
             time.perf_counter() - started, "s", None)


if __name__ == "__main__":
    main()
