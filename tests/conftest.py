"""Test environment, set once: JAX on CPU with 8 fake host devices (sharding tests)."""

import os

# Must happen before jax is imported anywhere. KJAX_TEST_PLATFORM lets the GPU tier
# (`pytest -m gpu`) keep the accelerator.
os.environ["JAX_PLATFORMS"] = os.environ.get("KJAX_TEST_PLATFORM", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import jax  # noqa: E402

jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])
