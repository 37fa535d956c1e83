"""Benchmarks of elastic_keras against what a user would run instead; see bench/README.md."""
