"""Elastic, fault-tolerant parameter-server training of Keras models on TensorFlow.

`elastic_keras.train(...)` runs a job from Python; `elastic-keras train` from a shell.
"""

__version__ = "0.1.0"


def __getattr__(name):
    # Imported on first use: roles import `elastic_keras.*` without loading the master.
    if name == "train":
        from elastic_keras.api import train

        return train
    raise AttributeError(f"module 'elastic_keras' has no attribute {name!r}")
