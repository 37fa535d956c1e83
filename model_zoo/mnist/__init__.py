"""MNIST digit classifiers: a functional and a subclassed Keras model, and the functional
one trained on augmented images."""
