"""kjax's RL update and grouped sampler compiled for a TPU pod without one (compile only).

`plan(cfg, model_config, topology, mesh_sizes, microbatches)` builds the trainer's own jitted
update (kjax.rl.components.step_and_sampler: loss_fn, optimizer, PPO epochs and
microbatches as configured) and its sampler (prefill once, one decode step with the KV
cache) from jax.ShapeDtypeStructs with kjax's NamedShardings on a mesh of the
topology's devices, e.g. `topology_devices("v5p:4x4x4")` (jax.experimental.topologies;
needs libtpu, `.[tpu]`), compiles them and reads what one chip holds and computes from
the compiler itself (memory_analysis, cost_analysis, the collectives of the HLO).
Nothing is allocated.

Every figure is *compiled, not run*: times are a roofline projection per chip from the
CHIPS specs, compute (FLOPs / peak FLOP/s), HBM (bytes / HBM bandwidth) and ICI (bytes
sent per mesh axis / the links it spans) side by side, the step at their max (perfect
overlap) and at their sum (none); uncalibrated (`calibration` compiles a step that a
published measurement can be set beside).

Layers: `chips` (specs, topology devices) <- `compiled` (what the compiler reports),
`costs` (analytic counts) and `memory` (the analytic memory estimate, for ordering
meshes) <- `planner` (the programs, compiled; Plan) <- `real` (the same mesh's step on
real tokens, RealPlan: the packed update and the compacting sampler for a
completion-length distribution, `lengths`).
"""

from kjax.scale.chips import (
    CHIPS,
    Chip,
    GiB,
    chip_of,
    libtpu_missing,
    topology_chips,
    topology_devices,
)
from kjax.scale.compiled import (
    UNBOUNDED_HBM_MIB,
    Compiled,
    compile_one,
    largest_buffers,
    mesh_group_key,
)
from kjax.scale.costs import (
    Shape,
    attention_density,
    decode_flops,
    forward_flops,
    matmul_params,
    overlap_projection,
    param_count,
    splash_attention_cost,
    update_flops,
)
from kjax.scale.memory import (
    UpdateMemory,
    memory_bound,
    sampler_memory,
    update_memory,
)
from kjax.scale.planner import (
    Plan,
    abstract_batch,
    abstract_params,
    abstract_state,
    compile_decode,
    compile_prefill,
    compile_reshard,
    compile_sampler,
    compile_update,
    decode_floor,
    kv_cache_bytes,
    param_dtype,
    per_chip_bytes,
    plan,
)

__all__ = [
    "CHIPS",
    "GiB",
    "Chip",
    "chip_of",
    "libtpu_missing",
    "topology_chips",
    "topology_devices",
    "UNBOUNDED_HBM_MIB",
    "Compiled",
    "compile_one",
    "largest_buffers",
    "mesh_group_key",
    "Shape",
    "decode_flops",
    "forward_flops",
    "matmul_params",
    "memory_bound",
    "UpdateMemory",
    "update_memory",
    "sampler_memory",
    "overlap_projection",
    "param_count",
    "splash_attention_cost",
    "attention_density",
    "update_flops",
    "Plan",
    "abstract_batch",
    "abstract_params",
    "abstract_state",
    "compile_decode",
    "compile_prefill",
    "compile_sampler",
    "compile_reshard",
    "compile_update",
    "decode_floor",
    "kv_cache_bytes",
    "param_dtype",
    "per_chip_bytes",
    "plan",
]
