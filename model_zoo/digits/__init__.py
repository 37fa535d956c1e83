"""A small CNN for scikit-learn's 8x8 handwritten digits."""
