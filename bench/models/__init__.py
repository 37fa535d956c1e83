"""Model-zoo modules (Keras 3) that only the benchmarks use: an MNIST MLP, and DeepFM over
bounded, hashed tables. `bench/pss_models.py` rebuilds the same architectures in tf_keras."""
