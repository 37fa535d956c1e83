"""Elastic, fault-tolerant parameter-server training of Keras models on TensorFlow.

`elastic_keras.train(...)` runs a job from Python (`evaluate`, `predict` and `export` use a
checkpoint); `elastic-keras train` from a shell.
"""

__version__ = "0.1.0"

_API = ("train", "evaluate", "predict", "export")


def __getattr__(name):
    # Imported on first use: roles import `elastic_keras.*` without loading the master.
    if name in _API:
        from elastic_keras import api

        return getattr(api, name)
    raise AttributeError(f"module 'elastic_keras' has no attribute {name!r}")
