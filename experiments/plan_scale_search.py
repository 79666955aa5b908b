"""experiments.plan_scale's slices and meshes: --topology / --mesh checked against the
slices each chip comes in, which (data, fsdp, tensor) x microbatches a slice can run,
ordered before compiling (by kjax.scale.memory_bound where the chip's HBM is given), and
the smallest slice that can hold a model's state."""

from __future__ import annotations

import math

from kjax.rl.config import TrainConfig

# Shapes a slice of each chip comes in (cloud.google.com/tpu/docs/<chip>), smallest first.
SLICES = {
    "v4": ["2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16"],
    "v5p": ["2x2x1", "2x2x2", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16"],
    "v5e": ["2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"],
    "v6e": ["2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"],
    "h100": ["1", "2", "4", "8", "16", "32", "64"],  # GPUs ("h100:8"), 8 to a host
}


def check_args(topology: str, mesh: str) -> tuple[list[str], tuple[int, ...] | None]:
    """(the --topology list, the --mesh sizes or None), each checked before anything
    needs the compiler (libtpu, CUDA): a ValueError names the flag and the fix."""
    topologies = [t.strip() for t in topology.split(",") if t.strip()]
    for t in topologies:
        chip, _, shape = t.partition(":")
        if chip in SLICES and shape not in SLICES[chip]:
            raise ValueError(
                f"--topology={t}: {chip} comes in {', '.join(SLICES[chip])} ; pick one of those."
            )
    if not mesh:
        return topologies, None
    parts = mesh.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"--mesh must be data,fsdp,tensor (three ints >= 1); got {mesh!r}.")
    sizes = tuple(int(p) for p in parts)
    for t in topologies:
        if t.partition(":")[0] in SLICES:
            chips = math.prod(int(d) for d in t.partition(":")[2].split("x"))
            if math.prod(sizes) != chips:
                raise ValueError(
                    f"--mesh={mesh} uses {math.prod(sizes)} devices but --topology={t} has "
                    f"{chips}; give sizes whose product is {chips} (or leave --mesh out)."
                )
    return topologies, sizes


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(cfg: TrainConfig, c, chips: int,
               hbm_bytes: int | None = None) -> list[tuple[tuple[int, int, int], int]]:  # fmt: skip
    """(data, fsdp, tensor), microbatches pairs that split B, tensor dividing the query
    heads and either dividing the kv heads or a multiple of them (the KV cache's rows
    then go over tensor, the training forward repeats the kv heads: kjax.sharding.
    cache_spec, kjax.models.attention.kv_weights_per_query_head), ordered by an analytic
    guess of what compiles to the fastest fitting step (fewest microbatches, then tensor
    parallelism just enough): the compiler ranks them after.
    With `hbm_bytes`, the meshes whose analytic memory estimate (kjax.scale.memory_bound:
    the update's state, saved residuals and workspace, and the sampler in the layout AUTO
    picks) fits it come first, the rest after by that estimate, smallest first."""
    from kjax.scale import Shape, memory_bound, param_dtype

    B, mini, out = cfg.batch_prompts, cfg.rl.minibatches, []
    for tensor in _divisors(chips):
        K = c.num_kv_heads
        if c.num_heads % tensor or (K % tensor and tensor % K):
            continue
        for fsdp in _divisors(chips // tensor):
            data = chips // tensor // fsdp
            rows = B // mini
            if B % mini or rows % (data * fsdp):
                continue
            for micro in _divisors(rows // (data * fsdp)):
                out.append(((data, fsdp, tensor), micro))
    speed = lambda m: (m[1] * m[0][2], -m[0][1], m[0][2])  # noqa: E731
    if hbm_bytes is None:
        return sorted(out, key=speed)
    import jax.numpy as jnp

    shape, itemsize = Shape.of(cfg), jnp.dtype(param_dtype(cfg)).itemsize
    kw = dict(
        act_itemsize=jnp.dtype(cfg.model.compute_dtype).itemsize,
        hbm_bytes=hbm_bytes,
        stream_split=cfg.rl.sequence_parallel,
    )
    bound = {m: memory_bound(c, shape, *m, mini, itemsize, **kw) for m in out}
    return sorted(out, key=lambda m: (bound[m] > hbm_bytes, bound[m] if bound[m] > hbm_bytes else 0,
                                      *speed(m)))  # fmt: skip


def smallest_topology(chip: str, state_bytes: int) -> str | None:
    """The smallest slice whose HBM holds the update's state (params, Adam moments,
    gradients) at least once over: a lower bound, activations not counted."""
    from kjax.scale import CHIPS

    for dims in SLICES[chip]:
        if math.prod(int(d) for d in dims.split("x")) * CHIPS[chip].hbm_bytes > state_bytes:
            return f"{chip}:{dims}"
    return None
