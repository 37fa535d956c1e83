"""The parameter-server role: one shard's dense variables, its optimizer and its gRPC service."""
