"""Benchmarks of kjax against itself and its peers (peers run in their own venvs)."""
