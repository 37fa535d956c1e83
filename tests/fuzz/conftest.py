"""Hypothesis profiles of the fuzz suite.

By default ("repeatable") every run draws the same examples, so the suite passes or fails
the same way each time it runs; `pytest tests/fuzz --hypothesis-profile explore` draws new
ones, ten times as many (1000 per test), to look for what the repeatable examples miss.
"""

from hypothesis import settings

settings.register_profile("repeatable", max_examples=100, derandomize=True, database=None)
settings.register_profile("explore", max_examples=1000)
settings.load_profile("repeatable")
