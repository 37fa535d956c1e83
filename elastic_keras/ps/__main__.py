"""`python -m elastic_keras.ps`: runs one parameter-server shard (see `elastic_keras.ps.main`)."""

import sys

from elastic_keras.common.heap import lifelong
from elastic_keras.common.log import quiet_native_logs

quiet_native_logs()

with lifelong():  # TensorFlow's modules, never collected
    from elastic_keras.ps.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
