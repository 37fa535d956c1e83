"""`python -m elastic_keras`: the `elastic-keras` command."""

import sys

from elastic_keras.common.log import quiet_native_logs

quiet_native_logs()

from elastic_keras.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
