"""Logging set-up shared by every role, in a format the local launcher can parse."""

import logging
import os
import sys

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def quiet_native_logs():
    """Hides TensorFlow's and gRPC's C++ start-up chatter; call before importing them."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def setup_logging(level="info"):
    """Sends this process's logs to stderr at `level`, and quiets TensorFlow's C++ logs."""
    quiet_native_logs()
    logging.basicConfig(
        level=level.upper(), format=LOG_FORMAT, stream=sys.stderr, force=True
    )
    for noisy in ("absl", "tensorflow"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
