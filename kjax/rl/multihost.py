"""Multi-host plumbing of the host loop: initialisation, barriers, global arrays, row sharing.

On one process every helper is the identity (or a no-op); with several (CPU processes over
gloo, or TPU/GPU hosts) each host loads the same global batch, verifies only the rows its
devices hold, and shares its verdicts through a global array.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import jax
import numpy as np
from jax.sharding import NamedSharding

R = TypeVar("R")


def maybe_initialize_distributed() -> None:
    """jax.distributed.initialize() when JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
    JAX_PROCESS_ID are set (CPU processes talk over gloo)."""
    if "JAX_COORDINATOR_ADDRESS" in os.environ and not jax.distributed.is_initialized():
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
            num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
            process_id=int(os.environ["JAX_PROCESS_ID"]),
        )


def device_count() -> int:
    """jax.device_count(), or a ValueError naming JAX_PLATFORMS and the fix when JAX cannot
    start the backend it names (e.g. JAX_PLATFORMS=gpu on a machine without one)."""
    try:
        return jax.device_count()
    except RuntimeError as e:
        if "backend" not in str(e):
            raise
        platforms = os.environ.get("JAX_PLATFORMS", "")
        raise ValueError(
            f"JAX cannot start its backend (JAX_PLATFORMS={platforms!r}): "
            f"{str(e).splitlines()[0]} Set JAX_PLATFORMS to a platform this machine has "
            "(cpu, or leave it unset to pick one)."
        ) from None


def is_leader() -> bool:
    """True on the process that writes shared files (process 0)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Waits until every process reaches the barrier `name` (no-op on one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def leader_first(name: str, fn: Callable[[], R]) -> R:
    """fn() on the leader, a barrier, then fn() on every process: for idempotent set-up
    that writes shared files once (a workdir's identity, a dataset) and reads them on all."""
    if is_leader():
        fn()
    barrier(name)
    return fn()


def put(x: np.ndarray, sh: NamedSharding) -> jax.Array:
    """A host array (the same on every host) as a global array sharded by `sh`."""
    return jax.make_array_from_callback(x.shape, sh, lambda index: x[index])


def local_rows(sh: NamedSharding, b: int) -> np.ndarray:
    """Rows of a [b, ...] batch sharded by `sh` that live on this host (all of them on one)."""
    index_map = sh.addressable_devices_indices_map((b,))
    return np.unique(np.concatenate([np.arange(b)[i] for i in index_map.values()]))


def share_rows(
    arrays: tuple[np.ndarray, ...], rows: np.ndarray, b: int, sh: NamedSharding
) -> tuple[np.ndarray, ...]:
    """Each host's `arrays` [len(rows), ...] for its `rows` -> the whole [b, ...] on every
    host (through a global array sharded by `sh`; identity on one process)."""
    if jax.process_count() == 1:
        return arrays
    from kjax import evaluation

    out = []
    for x in arrays:
        whole = np.zeros((b, *x.shape[1:]), x.dtype)
        whole[rows] = x  # only these rows are read by `put` on this host
        out.append(evaluation.to_host(put(whole, sh)))
    return tuple(out)
