"""Example model-zoo modules: plain Keras models written to the model-zoo contract."""
