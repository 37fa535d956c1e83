"""`python -m elastic_keras.worker`: runs one worker (see `elastic_keras.worker.main`)."""

import sys

from elastic_keras.common.log import quiet_native_logs

quiet_native_logs()

from elastic_keras.worker.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
