"""The master process: `python -m elastic_keras.master` takes `elastic-keras train`'s flags."""

import sys

from elastic_keras.common.log import quiet_native_logs

quiet_native_logs()

from elastic_keras.master.main import main  # noqa: E402

sys.exit(main())
