"""`python -m bench {all,dense,codec,embedding_table,sparse} [--quick]`: runs benchmarks, one
JSON line per result."""

import argparse
import tempfile

from bench import codec, dense, embedding_table, sparse, transfer

SUITES = {
    "dense": dense.run,
    "codec": codec.run,
    "embedding_table": embedding_table.run,
    "sparse": sparse.run,
    "transfer": transfer.run,
}


def main():
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("suite", choices=["all", *SUITES])
    parser.add_argument("--quick", action="store_true", help="fewer epochs and configurations")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work_dir:
        for name, run in SUITES.items():
            if args.suite in ("all", name):
                run(args.quick, work_dir)


if __name__ == "__main__":
    main()
