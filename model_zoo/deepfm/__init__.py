"""DeepFM over a hashed feature space, with a synthetic click-log generator."""
