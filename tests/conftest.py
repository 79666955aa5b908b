"""Test environment, set once: JAX on CPU with 8 fake host devices (sharding tests), and
one persistent compilation cache shared by every test, xdist worker and subprocess of the
run (many tests compile the same tiny trainer; the cache is deleted when the run ends)."""

import atexit
import os
import shutil
import tempfile

from tests import TEST_XLA_FLAGS

# Must happen before jax is imported anywhere. KJAX_TEST_PLATFORM lets the GPU tier
# (`pytest -m gpu`) keep the accelerator.
os.environ["JAX_PLATFORMS"] = os.environ.get("KJAX_TEST_PLATFORM", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
if os.environ["JAX_PLATFORMS"] == "cpu" and "optimization_level" not in os.environ["XLA_FLAGS"]:
    # The tests' models are tiny: LLVM's optimisation passes cost more compile time than
    # they save at run time (~30% off the suite). Semantics are unchanged (no fast-math).
    os.environ["XLA_FLAGS"] += " " + TEST_XLA_FLAGS

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # set here once; workers inherit it
    _cache = tempfile.mkdtemp(prefix="kjax-test-jit-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")

import jax  # noqa: E402

jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])
