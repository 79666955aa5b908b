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
    # The tests' models are tiny: compiling costs more than running. TEST_XLA_FLAGS turns
    # off the compile passes that do not pay here (tests/__init__.py says by how much).
    os.environ["XLA_FLAGS"] += " " + TEST_XLA_FLAGS

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # set here once; workers inherit it
    _cache = tempfile.mkdtemp(prefix="kjax-test-jit-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")

import jax  # noqa: E402

jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])

# The longest files, handed out first. Under xdist's `--dist loadfile` a file goes whole to
# the next free worker, in collection order; alphabetical order left the notebooks and the
# checkpoint kills for last, so one worker finished them while the other idled. Longest
# first leaves short files for the end. Worker-seconds from `--durations=0` (2026-12-07,
# 2-core Intel Xeon, 854 s of tests in all); within a file, and among the rest, the order
# is unchanged.
_LONG_FILES = (
    "tests/experiments/test_tables.py",  # ~66 s: every table module's --smoke run
    "tests/test_notebooks.py",  # ~43 s
    "tests/experiments/bench/test_bench_smoke.py",  # ~38 s: bench_rl_step, bench_padding
    "tests/test_pruned_sampling.py",  # ~31 s
    "tests/objectives/test_shrinkage.py",  # ~31 s
    "tests/rl/test_forward.py",
    "tests/rl/test_resume.py",  # ~29 s: LoRA's kill -9 resume
    "tests/rl/test_multihost.py",
    "tests/test_checkpoint.py",
    "tests/experiments/test_run_safety.py",
    "tests/rewards/test_code_hostile.py",
    "tests/tasks/test_train_tasks.py",
    "tests/rl/test_loss_fn.py",
    "tests/test_scale.py",
    "tests/rl/test_lag.py",
    "tests/test_sampling.py",
    "tests/rl/test_train_step.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(_LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
