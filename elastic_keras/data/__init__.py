"""Record files: readers with sidecar offset indexes, path expansion, shards and conversion."""
