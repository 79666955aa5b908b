"""Datasets: tensorflow-datasets builders (offline, array_record), loaders and prompts."""
