"""The `elastic-keras data` command: convert a CSV, `.npz` or named data set to record files.

Example:

    elastic-keras data sklearn:digits --output data/digits --num-shards 2 --holdout-every 5
"""

import argparse
import sys

from elastic_keras.common.errors import ConfigError, DataError
from elastic_keras.data.convert import WRITERS, ConversionSpec, convert
from elastic_keras.data.sources import NAMED_DATASETS


def register(subparsers):
    """Adds the `data` subcommand to an argparse subparsers object; its `func` is `run`."""
    parser = subparsers.add_parser(
        "data",
        help="Convert a CSV, .npz or named data set into training record files.",
        description="Convert a CSV (.csv, .csv.gz), .npz or named data set into sharded "
        "TFRecord files of tf.train.Example (or CSV files with a header), ready for "
        "--training-data. Named data sets: " + ", ".join(NAMED_DATASETS) + " (keras:* "
        "download, so they need network access).",
    )
    parser.add_argument("source", metavar="SOURCE", help="A .csv, .csv.gz or .npz file, or a "
                        "data set name such as sklearn:digits.")
    parser.add_argument("--output", required=True, help="The output directory.")
    parser.add_argument("--num-shards", type=int, default=1,
                        help="Record files per output directory (default 1).")
    parser.add_argument("--holdout-every", type=int, default=0, metavar="K",
                        help="Send rows whose index %% K == 0 to OUTPUT/test/ and the others "
                        "to OUTPUT/train/ (K >= 2; default: no split, all rows to OUTPUT/).")
    parser.add_argument("--shuffle", action="store_true",
                        help="Shuffle the rows of each split (after splitting).")
    parser.add_argument("--seed", type=int, default=0, help="The shuffle's seed (default 0).")
    parser.add_argument("--no-header", action="store_true",
                        help="The CSV source has no header line.")
    parser.add_argument("--column-names", default="",
                        help="Comma-separated CSV column names; 'name:k' gathers k columns "
                        "into one feature, e.g. image:784,label.")
    parser.add_argument("--format", choices=tuple(WRITERS), default="tfrecord",
                        help="Output format (default tfrecord).")
    parser.set_defaults(func=run)
    return parser


def run(args):
    """Runs the `data` command for parsed `args`; returns the process exit code.

    Prints one line per output directory; on bad input prints what is wrong to stderr and
    returns 2.
    """
    try:
        spec = ConversionSpec(
            source=args.source,
            output=args.output,
            num_shards=args.num_shards,
            holdout_every=args.holdout_every,
            shuffle=args.shuffle,
            seed=args.seed,
            header=not args.no_header,
            column_names=_column_names(args.column_names),
            format=args.format,
        )
        splits = convert(spec)
    except (DataError, ConfigError) as exc:
        print(f"elastic-keras data: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"elastic-keras data: error: cannot write {args.output}: {exc}", file=sys.stderr)
        return 1
    for split in splits:
        print(f"{split.directory}: {len(split.files)} {spec.format} files, {split.rows} rows")
    return 0


def _column_names(value):
    names = tuple(name.strip() for name in value.split(",")) if value else ()
    if any(not name for name in names):
        raise ConfigError(f"--column-names must not hold an empty name. Received: {value!r}")
    return names


def main(argv=None):
    """Runs `data` as a standalone command (`python -m elastic_keras.data.command`)."""
    parser = argparse.ArgumentParser(prog="elastic-keras")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
