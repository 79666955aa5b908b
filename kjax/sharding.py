"""Device meshes and parameter shardings from one logical-axis rules table.

Parameters carry logical axis names (nnx.Param metadata `axes`, e.g. ("vocab", "embed"));
RULES maps each name to mesh axes. Activations shard their batch over ("data", "fsdp").
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Mapping

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# The one table: logical axis -> mesh axis (or axes, or None = replicated).
RULES: Mapping[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),
    "vocab": "tensor",
    "embed": "fsdp",
    "mlp": "tensor",
    "heads": "tensor",  # also q's bias [L,H,E] (Qwen2): sharded as q's output
    "kv_heads": "tensor",  # also k's and v's biases [L,K,E]
    "head_dim": None,  # also the per-head q/k norm weights [L,E] (Qwen3): replicated
    "layers": None,
    "norm": None,
    # The positions of the training forward's residual stream between layers
    # (constrain_residual, inside sequence_split(True) only); no parameter has this axis.
    "sequence": "tensor",
}

# Whether the training forward being traced splits its residual stream (sequence_split).
_SEQUENCE_SPLIT = contextvars.ContextVar("kjax_sequence_split", default=False)


@contextlib.contextmanager
def sequence_split(on: bool):
    """Within it, the training forward traced splits its residual stream's positions over
    the sequence rule's axes (constrain_residual, gather_sequence, scatter_sequence:
    sequence parallelism); outside, or with on=False, those are constrain_batch and the
    identity, the program as before. StepConfig.sequence_parallel turns it on for a run's
    update (kjax.rl.train_step traces its step inside this)."""
    token = _SEQUENCE_SPLIT.set(bool(on))
    try:
        yield
    finally:
        _SEQUENCE_SPLIT.reset(token)


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices=None) -> Mesh:
    """A ("data", "fsdp", "tensor") mesh over all devices (all hosts) by default.

    One size may be -1 to take the remaining devices; the product must equal the
    device count.
    """
    devices = jax.devices() if devices is None else list(devices)
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1:
        raise ValueError(f"make_mesh: at most one of data/fsdp/tensor may be -1, got {sizes}")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"make_mesh: {len(devices)} devices do not divide into {sizes}")
        sizes[sizes.index(-1)] = len(devices) // known
    if int(np.prod(sizes)) != len(devices):
        raise ValueError(
            f"make_mesh: data*fsdp*tensor = {sizes} needs {int(np.prod(sizes))} devices, "
            f"there are {len(devices)}; use -1 for one axis to fill the rest"
        )
    try:
        return jax.make_mesh(
            tuple(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices
        )
    except NotImplementedError:
        # A TPU torus whose axes do not multiply into these sizes (8 x 8 on v5p's 4x4x4):
        # split a physical axis across two mesh axes rather than refuse the mesh.
        from jax.experimental import mesh_utils

        grid = mesh_utils.create_device_mesh(sizes, devices, allow_split_physical_axes=True)
        return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def logical_to_spec(axes, shape, mesh: Mesh, rules=RULES) -> PartitionSpec:
    """PartitionSpec of an array with logical `axes` and `shape` on `mesh`.

    A dimension whose size the mesh axes do not divide (e.g. 9 heads over tensor=2) is
    replicated rather than failing, and a mesh axis is used at most once per array.
    """
    used: set[str] = set()
    spec = []
    for name, size in zip(axes, shape, strict=True):
        target = rules.get(name) if name is not None else None
        names = (target,) if isinstance(target, str) else tuple(target or ())
        names = tuple(n for n in names if n in mesh.shape and n not in used)
        if not names or size % int(np.prod([mesh.shape[n] for n in names])):
            spec.append(None)
            continue
        used.update(names)
        spec.append(names[0] if len(names) == 1 else names)
    return PartitionSpec(*spec)


def _is_variable(x) -> bool:
    return isinstance(x, nnx.Variable)


def shardings_for(tree, mesh: Mesh, rules=RULES):
    """NamedShardings for an nnx.State (abstract or concrete), same structure.

    Variables without `axes` metadata are replicated.
    """

    def one(v):
        axes = v.get_metadata().get("axes")
        shape = v.shape if hasattr(v, "shape") else np.shape(v[...])
        spec = PartitionSpec() if axes is None else logical_to_spec(axes, shape, mesh, rules)
        return v.replace(NamedSharding(mesh, spec))

    return jax.tree.map(one, tree, is_leaf=_is_variable)


def batch_sharding(mesh: Mesh, rules=RULES) -> NamedSharding:
    """Sharding of a [B, ...] activation or input: B over the "batch" rule's mesh axes."""
    return NamedSharding(mesh, PartitionSpec(rules["batch"]))


def create_sharded(make: Callable[[], nnx.Module], mesh: Mesh, rules=RULES) -> nnx.Module:
    """Builds `make()` with every parameter created directly in its shards.

    Shapes come from `nnx.eval_shape`; then one `jax.jit(..., out_shardings=...)` runs
    the initializers, so a large model never materializes on a single device.
    """
    graphdef, abstract = nnx.split(nnx.eval_shape(make))
    shardings = shardings_for(abstract, mesh, rules)
    state = jax.jit(lambda: nnx.split(make())[1], out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def shard(module: nnx.Module, mesh: Mesh, rules=RULES) -> nnx.Module:
    """Moves an existing module's state onto `mesh` by the rules (a new module)."""
    graphdef, state = nnx.split(module)
    return nnx.merge(graphdef, jax.device_put(state, shardings_for(state, mesh, rules)))


def _axes_of(rule, mesh) -> tuple[str, ...]:
    names = (rule,) if isinstance(rule, str) else tuple(rule or ())
    return tuple(n for n in names if n in mesh.shape)


def _size(names, mesh) -> int:
    return int(np.prod([mesh.shape[n] for n in names]))


def head_layout(rows: int, vocab: int, rules=RULES) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(row axes, vocabulary axes) of the loss head under the traced mesh
    (kjax.rl.forward): its rows over the batch rule's axes (those that divide `rows`),
    its vocabulary over the vocab rule's (tensor) where they divide `vocab`; axes of size
    1 left out, so ((), ()) without a mesh or on one device."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return (), ()
    row_axes = tuple(n for n in _axes_of(rules["batch"], mesh) if mesh.shape[n] > 1)
    while row_axes and rows % _size(row_axes, mesh):
        row_axes = row_axes[:-1]
    vocab_axes = tuple(
        n for n in _axes_of(rules["vocab"], mesh) if mesh.shape[n] > 1 and n not in row_axes
    )
    if vocab_axes and vocab % _size(vocab_axes, mesh):
        vocab_axes = ()
    return row_axes, vocab_axes


def gather_over_fsdp(tree, axes, rules=RULES):
    """Each array of `tree` (a layer's weights: {name: array}) laid out by its logical
    `axes` ({name: axes}) with the embed rule's axes (fsdp) left out, i.e. all-gathered
    over fsdp, when traced under a mesh; arrays without axes, and everything without a
    mesh, as they are.

    Called on a layer's weights inside the training forward, it makes the partitioner
    gather the weights over fsdp and reduce-scatter their gradients (ZeRO-3), where it
    had all-gathered the activations of every fsdp group for the weight gradients (8B on
    v6e-64: bf16[135168, 4096], 1.1 GB per layer and microbatch)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return tree
    gathered = {**rules, "embed": None}

    def one(name, x):
        if axes.get(name) is None:
            return x
        spec = logical_to_spec(axes[name], x.shape, mesh, gathered)
        return jax.lax.with_sharding_constraint(x, spec)

    return {name: one(name, x) for name, x in tree.items()}


def batch_shards(rules=RULES) -> int:
    """How many parts the batch rule's mesh axes split a row axis into, under the mesh
    traced under (`jax.sharding.use_abstract_mesh`); 1 without one."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty else _size(_axes_of(rules["batch"], mesh), mesh)


def constrain(x, *spec):
    """x laid out as PartitionSpec(*spec) when traced under a mesh; x as is without one."""
    if jax.sharding.get_abstract_mesh().empty:
        return x
    return jax.lax.with_sharding_constraint(x, PartitionSpec(*spec))


def constrain_batch(x, axis: int = 0, rules=RULES):
    """x with its B axis (`axis`; [B*N] rows count as B) laid out over the batch rule's
    mesh axes, when traced under a mesh (`jax.sharding.use_abstract_mesh`, as kjax.rl
    traces the update and the sampler); x as is without one, or when those axes do not
    divide that dimension.

    Without it GSPMD lets an activation take a weight's layout: the embedding lookup of
    an fsdp-sharded table came out sharded over D with B replicated, so every chip ran
    (and stored the residuals of) all of its fsdp group's rows.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    names = _axes_of(rules["batch"], mesh)
    size = _size(names, mesh)
    if size <= 1 or x.shape[axis] % size:
        return x
    return jax.lax.with_sharding_constraint(x, PartitionSpec(*([None] * axis), names))


def _residual_axes(shape, mesh, rules) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """(batch axes, sequence axes) of a residual stream [B, L, D] (constrain_residual):
    the batch rule's axes where they split B (None where they do not: B left to
    propagation, as constrain_batch leaves it; () on a mesh without them), and the
    sequence rule's other axes of size > 1 where they split L inside sequence_split(True),
    else ()."""
    batch = _axes_of(rules["batch"], mesh)
    split = _SEQUENCE_SPLIT.get()
    seq = tuple(n for n in _axes_of(rules["sequence"], mesh) if split and n not in batch)
    seq = tuple(n for n in seq if mesh.shape[n] > 1)
    if seq and shape[1] % _size(seq, mesh):
        seq = ()
    if _size(batch, mesh) <= 1:
        return (), seq
    return (batch if shape[0] % _size(batch, mesh) == 0 else None), seq


def constrain_residual(x, rules=RULES):
    """The residual stream x [B, L, D] of the training forward between layers (the layer
    scan's carry, which its backward keeps for every layer): B over the batch rule's mesh
    axes as `constrain_batch`, and inside sequence_split(True) the L positions over the
    sequence rule's (tensor), D whole, when traced under a mesh; x as is without one.
    Outside sequence_split(True), or where those axes do not divide L, this is
    constrain_batch.

    With L whole the saved inputs are [layers, B, L, D] on every tensor device: the 70B
    CodeContests update on v5p-128 (fsdp 8 x tensor 16) kept bf16[80,1,34304,8192],
    41.9 GiB per chip (and the residual after attention as much), and did not fit; the
    program before issue 44's vocabulary-parallel head had split it by propagation from
    the head's rows. Split over tensor they are 1/tensor of that. The layers gather their
    normed inputs (`gather_sequence`) before the projections and split their output sums
    (`scatter_sequence`): sequence parallelism. The TPU compiler keeps the all-reduce of
    those sums and slices it, so the gathers are extra interconnect bytes (a 4-layer
    D=1024 update at fsdp 2 x tensor 4 on v5p: tensor bytes 1.75e8 -> 3.05e8 per chip,
    FLOPs unchanged, HBM bytes 2% lower), hence a switch (StepConfig.sequence_parallel),
    on where the whole stream does not fit. Only the layout changes, not the values."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    batch, seq = _residual_axes(x.shape, mesh, rules)
    if not seq:
        return constrain_batch(x, rules=rules)
    return jax.lax.with_sharding_constraint(x, _spec(batch, seq))


def _spec(batch, seq) -> PartitionSpec:
    free = PartitionSpec.UNCONSTRAINED
    if batch is None:
        return PartitionSpec(free, seq or None, free)
    return PartitionSpec(batch or None, seq or None, None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _relayout(x, to: PartitionSpec, back: PartitionSpec):
    """x laid out as `to`; its cotangent laid out as `back` (not as `to`, as a plain
    with_sharding_constraint's transpose would)."""
    return jax.lax.with_sharding_constraint(x, to)


def _relayout_fwd(x, to, back):
    return _relayout(x, to, back), None


def _relayout_bwd(to, back, _, g):
    return (jax.lax.with_sharding_constraint(g, back),)


_relayout.defvjp(_relayout_fwd, _relayout_bwd)


def gather_sequence(x, rules=RULES):
    """A layer's normed input x [B, L, D], whose positions `constrain_residual` split over
    tensor, gathered to whole rows for the projections against their tensor-split
    weights; its cotangent (the projections' partial sums) comes back split, a
    reduce-scatter (Megatron's sequence-parallel all-gather and its conjugate). x as is
    without a mesh or where constrain_residual does not split L."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    batch, seq = _residual_axes(x.shape, mesh, rules)
    return _relayout(x, _spec(batch, ()), _spec(batch, seq)) if seq else x


def scatter_sequence(x, rules=RULES):
    """The conjugate of gather_sequence, for a projection's output x [B, L, D] (sums over
    the tensor-split heads or MLP columns) added to the residual stream: reduce-scattered
    to the stream's split positions; its cotangent is gathered to whole rows again, for
    the projection's backward against the same weights. Without these two the
    partitioner all-gathered the weights over tensor in the backward (every chip then ran
    the whole-weight matmul on its split rows). x as is where gather_sequence is."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    batch, seq = _residual_axes(x.shape, mesh, rules)
    return _relayout(x, _spec(batch, seq), _spec(batch, ())) if seq else x


def spread_logits(x, rules=RULES):
    """A decode step's logits x [R, V] moved from the head's layout (rows over the batch
    rule's axes, the vocabulary over the vocab rule's: pinned first, so that the head's
    matmul keeps it) to rows over every mesh axis of the batch rule, then of the vocab
    rule (tensor), that divides R, the vocabulary whole: an all-to-all. The draw then
    runs on R / devices rows per chip, where it had all-gathered every row's float32
    logits to every tensor device and drawn them there (the 8B decode on v6e-64: 131 MB
    per chip per step, and each pass of the draw over it, on all 8 tensor devices).
    x as is without a mesh."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    x = jax.lax.with_sharding_constraint(
        x, logical_to_spec(("batch", "vocab"), x.shape, mesh, rules)
    )
    batch = _axes_of(rules["batch"], mesh)
    names = batch + tuple(n for n in _axes_of(rules["vocab"], mesh) if n not in batch)
    names = tuple(n for n in names if mesh.shape[n] > 1)
    while names and x.shape[0] % _size(names, mesh):
        names = names[:-1]
    return jax.lax.with_sharding_constraint(x, PartitionSpec(names or None, None))


def cache_spec(shape, mesh, rules=RULES) -> PartitionSpec:
    """Layout of a K/V cache [L, rows, length, K, E] on `mesh` (concrete or abstract).

    The kv heads go over the kv_heads rule's axes (tensor) where those divide K. Where
    they do not (8 kv heads on tensor 16 or 32), the heads stay whole and the rows go
    over those axes too, after the batch rule's: otherwise every tensor device would
    hold its batch group's whole cache (the 8B sampler on v5e-256 needed 33 GiB of
    cache per chip that way). Axes that do not divide the rows are left out, so a
    dimension is never split unevenly.
    """
    _, rows, _, K, _ = shape
    batch = _axes_of(rules["batch"], mesh)
    heads = _axes_of(rules["kv_heads"], mesh)
    heads = tuple(n for n in heads if n not in batch and mesh.shape[n] > 1)
    head_spec = None
    if heads and K % _size(heads, mesh) == 0:
        head_spec = heads[0] if len(heads) == 1 else heads
        heads = ()
    row_axes = batch + heads
    while row_axes and rows % _size(row_axes, mesh):
        row_axes = row_axes[:-1]
    row_spec = (row_axes[0] if len(row_axes) == 1 else row_axes) if row_axes else None
    return PartitionSpec(None, row_spec, None, head_spec, None)


def constrain_cache(x, rules=RULES):
    """A K/V cache [L, rows, length, K, E] laid out by `cache_spec` when traced under a
    mesh; x as is without one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, cache_spec(x.shape, mesh, rules))


def _cache_rows_take_heads_axes(rows: int, K: int, mesh, rules) -> tuple | None:
    """The row spec of a cache with `rows` rows and K kv heads when cache_spec puts the
    rows over a kv_heads axis (tensor cannot split the heads); None otherwise."""
    spec = cache_spec((1, rows, 1, K, 1), mesh, rules)
    row = spec[1]
    names = row if isinstance(row, tuple) else (row,)
    return row if set(names) & set(_axes_of(rules["kv_heads"], mesh)) else None


def to_cache_rows(x, num_kv_heads: int, rules=RULES):
    """x [rows, ...] (queries of a decode step) laid out over the same devices as the
    rows of a K/V cache with num_kv_heads heads, where cache_spec puts those rows over
    tensor; x as is otherwise (and without a mesh). Pinning the queries (and, with
    `from_cache_rows`, the attention's output) keeps the row layout local to the
    attention over the cache: left to propagation, it spread into the layer's
    projections, whose weights were then all-gathered over tensor (8B on v5e-256: 10 GB
    of all-gathers per decode step, against 0.8)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    row = _cache_rows_take_heads_axes(x.shape[0], num_kv_heads, mesh, rules)
    if row is None:
        return x
    return jax.lax.with_sharding_constraint(x, PartitionSpec(row, *([None] * (x.ndim - 1))))


def from_cache_rows(x, num_kv_heads: int, rules=RULES, axes=("batch", None, "heads", "head_dim")):
    """The inverse of to_cache_rows for an attention output [rows, S, H, ...]: rows over
    the batch axes and heads over the heads rule's axes again, where to_cache_rows moved
    them; x as is otherwise. `axes` (logical) name another layout: the decode step pins
    the fed token's k and v [rows, 1, K, E] to ("batch", None, None, None), rows over the
    batch axes with the kv heads whole; unpinned, they were computed for every row on
    every chip (the 8B decode on v5e-256: 1.47x the FLOPs and 17.9 against 10.7 GB of
    HBM traffic per step)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or _cache_rows_take_heads_axes(x.shape[0], num_kv_heads, mesh, rules) is None:
        return x
    axes = axes[: x.ndim]
    return jax.lax.with_sharding_constraint(x, logical_to_spec(axes, x.shape, mesh, rules))
