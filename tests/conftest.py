"""Shared test settings: property tests draw the same examples on every run (reproducible CI)."""

from hypothesis import settings

settings.register_profile("kvtune", derandomize=True, deadline=None)
settings.load_profile("kvtune")
