"""Generated protocol code: never edit by hand; regenerate with `python protos/generate.py`."""
