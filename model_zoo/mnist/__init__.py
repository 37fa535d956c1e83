"""MNIST digit classifiers: one functional and one subclassed Keras model."""
