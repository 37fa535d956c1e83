"""Pieces every role stands on: config, errors, RPC, tensor codec, model-module loading."""
