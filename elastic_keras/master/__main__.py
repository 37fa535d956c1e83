"""The master process: `python -m elastic_keras.master` takes the flags of `elastic-keras train`."""

import sys

from elastic_keras.cli import main

sys.exit(main(["train", *sys.argv[1:]]))
