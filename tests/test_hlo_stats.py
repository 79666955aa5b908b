"""kjax.hlo_stats's HBM and interconnect counts on tiny programs the real TPU compiler
(libtpu) compiled for a v6e:2x2 slice: each case the count handles is asserted present in
the compiled HLO, and its bytes derived from the shapes by hand."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from kjax import hlo_stats, scale

pytestmark = pytest.mark.skipif(
    scale.libtpu_missing() is not None,
    reason=f"{scale.libtpu_missing()}: no TPU compiler to compile for a TPU topology",
)


@pytest.fixture(scope="module")
def one_chip():
    return Mesh(scale.topology_devices("v6e:2x2")[:1], ("x",))


def _abstract(mesh, shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P()))


def _instrs(text, op, target=None):
    found = [i for body in hlo_stats.computations(text).values() for i in body if i.op == op]
    return [i for i in found if target is None or f'custom_call_target="{target}"' in i.attrs]


def test_vmem_arrays_and_prefetches_count_what_hbm_moves(one_chip):
    """tanh(tanh(tanh(x w1) w2) w3), four bf16 [n, n] inputs: the compiler keeps the
    intermediates in VMEM (S(1)) and prefetches two weights whole (copy-start) and one in
    two halves (slice-start). HBM moves each input once and the output once: 5 n^2 x 2
    bytes (the old count, every array touched, said about twice that)."""
    n = 2048
    x = _abstract(one_chip, (n, n), jnp.bfloat16)
    f = lambda x, w1, w2, w3: jnp.tanh(jnp.tanh(jnp.tanh(x @ w1) @ w2) @ w3)  # noqa: E731
    text = jax.jit(f).lower(x, x, x, x).compile().as_text()
    copies, slices = _instrs(text, "copy-start"), _instrs(text, "slice-start")
    assert copies and slices and "S(1)" in text
    # A whole-array prefetch into VMEM: the source read once (the old count: 3 n^2 x 2).
    assert all("S(1)" in hlo_stats._elements(c.type)[0] for c in copies)
    shapes = {i.name: i.type for body in hlo_stats.computations(text).values() for i in body}
    for c in copies:
        assert hlo_stats._instr_bytes(c, {}, {}, shapes) == n * n * 2
    # Sliced prefetches: together they read the source once.
    assert sum(hlo_stats._instr_bytes(s, {}, {}, shapes) for s in slices) == n * n * 2
    assert hlo_stats.module_stats(text).bytes == 5 * n * n * 2
    assert hlo_stats.module_stats(text).flops == 3 * 2 * n**3


def test_allocate_buffer_and_in_place_updates_of_multi_output_fusions(one_chip):
    """The gradient of a scan over L = 8 layers of tanh(x w_l), f32 [512, 2048] rows and
    [2048, 2048] weights: the stacked residuals are AllocateBuffer'd in HBM and written a
    layer at a time by in-place dynamic-update-slices, two of them the outputs of one
    multi-output fusion."""
    L, R, D = 8, 512, 2048
    w, x = _abstract(one_chip, (L, D, D), jnp.float32), _abstract(one_chip, (R, D), jnp.float32)

    def loss(w, x):
        return jax.lax.scan(lambda c, wi: (jnp.tanh(c @ wi), None), x, w)[0].sum()

    text = jax.jit(jax.grad(loss)).lower(w, x).compile().as_text()
    comps, roots, _ = hlo_stats._parse(text)
    shapes = {i.name: i.type for body in comps.values() for i in body}
    allocs = [a for a in _instrs(text, "custom-call", "AllocateBuffer") if "S(1)" not in a.type]
    assert allocs  # in HBM, f32[8,512,2048] and the like: reserved, nothing moves
    assert all(hlo_stats._instr_bytes(a, comps, roots, shapes) == 0 for a in allocs)
    multi = [
        f
        for f in _instrs(text, "fusion")
        if hlo_stats._elements(f.type).count("f32[8,512,2048]{1,2,0:T(8,128)}") == 2
    ]
    assert len(multi) == 1
    (fusion,) = multi
    # Its other operands (the layer's input and weights) and third output are in VMEM:
    # it writes two f32 [1, 512, 2048] updates and reads nothing from HBM.
    buffers = [o for o in fusion.operands if shapes[o].startswith("f32[8,512,2048]")]
    others = [o for o in fusion.operands if o not in buffers and "s32[]" not in shapes[o]]
    assert len(buffers) == 2 and all("S(1)" in shapes[o] for o in others)
    assert hlo_stats._instr_bytes(fusion, comps, roots, shapes) == 2 * R * D * 4
    # The old count: the whole buffer written for each output, and each read.
    assert hlo_stats._bytes(fusion.type) >= 2 * L * R * D * 4


def _matmul_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...])


def _pallas_matmul(x, y, *, name, cost_estimate=None):
    out = jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), jnp.float32)
    return pl.pallas_call(_matmul_kernel, out_shape=out, name=name, cost_estimate=cost_estimate)(
        x, y
    )


def _shape(type_str):
    return [int(d) for d in re.search(r"\[([\d,]*)\]", type_str).group(1).split(",")]


def test_pallas_kernel_flops_from_a_hook_or_its_own_estimate(one_chip):
    """A tiny Pallas matmul [M, K] @ [K, N] compiled for v6e: 0 FLOPs (one uncosted
    kernel) with nothing to go on, the kernel's own cost estimate when it gives one, and
    the hook's figure from the shapes when given; bytes: its operands and result once."""
    M, K, N = 256, 128, 512
    x, y = _abstract(one_chip, (M, K), jnp.float32), _abstract(one_chip, (K, N), jnp.float32)
    plain = jax.jit(functools.partial(_pallas_matmul, name="mm")).lower(x, y).compile().as_text()
    assert _instrs(plain, "custom-call", "tpu_custom_call")
    moved = 4 * (M * K + K * N + M * N)
    stats = hlo_stats.module_stats(plain)
    assert (stats.flops, stats.bytes, stats.uncosted_kernels) == (0.0, moved, 1)

    seen = []

    def cost(kernel):
        seen.append(kernel.name)
        if kernel.name != "mm":
            return None
        (m, k), (_, n) = (_shape(t) for t in kernel.operands)
        return hlo_stats.KernelCost(2.0 * m * k * n, float(moved))

    stats = hlo_stats.module_stats(plain, kernel_cost=cost)
    assert seen == ["mm"]
    assert (stats.flops, stats.bytes, stats.uncosted_kernels) == (2.0 * M * K * N, moved, 0)

    estimate = pl.CostEstimate(flops=123, transcendentals=0, bytes_accessed=456)
    fn = functools.partial(_pallas_matmul, name="mm2", cost_estimate=estimate)
    stats = hlo_stats.module_stats(jax.jit(fn).lower(x, y).compile().as_text())
    assert (stats.flops, stats.bytes, stats.uncosted_kernels) == (123.0, 456.0, 0)


def test_collectives_are_counted_per_mesh_axis_over_its_links():
    """On v6e:2x2 as data 1 x fsdp 2 x tensor 2, a [R, C] block per chip: an all-gather
    over fsdp (result [2R, C]) and an all-reduce over tensor (result [R, C]). Ring
    algorithms over 2 chips: the gather sends half its result, the all-reduce 2 x 1/2 of
    its result, one block each. Each axis spans one of v6e's two torus dimensions: 200
    GB/s out of each chip (half of 800 GB/s bidirectional, half of the links)."""
    # fsdp along the torus's y, tensor along x (sharding.make_mesh orders 2x2 as a ring,
    # which would put an fsdp pair on a diagonal).
    devices = sorted(scale.topology_devices("v6e:2x2"), key=lambda d: (d.coords[1], d.coords[0]))
    mesh = Mesh(np.array(devices).reshape(1, 2, 2), ("data", "fsdp", "tensor"))
    R, C = 256, 512

    @functools.partial(
        jax.shard_map,
        mesh=mesh,
        in_specs=P("fsdp", "tensor"),
        out_specs=(P(None, "tensor"), P("fsdp", None)),
        check_vma=False,
    )
    def f(x):
        return jax.lax.all_gather(x, "fsdp", tiled=True), jax.lax.psum(x, "tensor")

    x = jax.ShapeDtypeStruct((2 * R, 2 * C), jnp.float32, sharding=NamedSharding(mesh, P()))
    compiled = scale.compile_one("collectives", jax.jit(f), x, mesh=mesh)
    block = R * C * 4
    assert compiled.ici == {"fsdp": (block, 1), "tensor": (block, 1)}
    chip = scale.CHIPS["v6e"]
    assert chip.egress(1) == 200e9
    assert compiled.ici_seconds(chip) == pytest.approx(2 * block / 200e9)
    assert compiled.serial_seconds_on(chip) == pytest.approx(
        compiled.compute_seconds(chip) + compiled.hbm_seconds(chip) + 2 * block / 200e9
    )


@pytest.mark.parametrize(
    "attrs, groups",
    [
        ("replica_groups={{0,1},{2,3}}, x", [(0, 1), (2, 3)]),
        ("replica_groups=[2,2]<=[4], x", [(0, 1), (2, 3)]),
        ("replica_groups=[2,2]<=[2,2]T(1,0), x", [(0, 2), (1, 3)]),
        ("replica_groups=mesh['a'=2,'b'=1,'c'=2] {'a'}, x", [(0, 2), (1, 3)]),
        ("source_target_pairs={{0,1},{1,0}}, x", [(0, 1), (1, 0)]),
    ],
)
def test_replica_group_forms(attrs, groups):
    assert hlo_stats._replica_groups(attrs) == groups


def test_splash_attention_kernels_costed_from_their_shapes_and_mask(one_chip):
    """jax's Pallas splash attention (causal, H = 2 heads, L = 512, E = 128, 128-blocks)
    and its gradient compiled for v6e: three kernels (fwd, dq, dkv), 0 FLOPs without a
    cost, and with kjax.scale.splash_attention_cost at the mask's block density (10 of
    the 4 x 4 blocks on or below the diagonal) (4 + 6 + 8) x H x L x L x E x 10/16."""
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as splash,
    )
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask as masks,
    )

    H, L, E, block = 2, 512, 128, 128
    mask = masks.MultiHeadMask([masks.CausalMask((L, L)) for _ in range(H)])
    sizes = {
        f"block_{name}": block
        for name in ("q", "kv", "kv_compute", "q_dkv", "kv_dkv", "kv_dkv_compute", "q_dq", "kv_dq")
    }
    kernel = splash.make_splash_mha(
        mask, head_shards=1, q_seq_shards=1, block_sizes=splash.BlockSizes(**sizes)
    )

    def f(q, k, v):
        return jax.grad(lambda *a: kernel(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2))(q, k, v)

    x = _abstract(one_chip, (H, L, E), jnp.bfloat16)
    text = jax.jit(f).lower(x, x, x).compile().as_text()
    assert len(_instrs(text, "custom-call", "tpu_custom_call")) == 3
    assert hlo_stats.module_stats(text).uncosted_kernels == 3
    stats = hlo_stats.module_stats(text, kernel_cost=scale.splash_attention_cost(10 / 16))
    assert stats.uncosted_kernels == 0
    assert stats.flops == pytest.approx((4 + 6 + 8) * H * L * L * E * 10 / 16)


_SLICED = """HloModule sliced, is_scheduled=true

ENTRY %main (p: bf16[32,256,1024,1,128], i: s32[]) -> (bf16[32,256,16,1,128], bf16[1,256,1024,1,128]) {
  %p = bf16[32,256,1024,1,128]{4,2,1,3,0:T(8,128)(2,1)} parameter(0)
  %i = s32[]{:T(128)} parameter(1)
  %s = bf16[32,256,16,1,128]{4,2,1,3,0:T(8,128)(2,1)S(1)} slice(%p), slice={[0:32], [0:256], [0:16], [0:1], [0:128]}
  %z = s32[]{:T(128)} constant(0)
  %d = bf16[1,256,1024,1,128]{4,2,1,3,0:T(8,128)(2,1)} dynamic-slice(%p, %i, %z, %z, %z, %z), dynamic_slice_sizes={1,256,1024,1,128}
  ROOT %t = (bf16[32,256,16,1,128]{4,2,1,3,0:T(8,128)(2,1)S(1)}, bf16[1,256,1024,1,128]{4,2,1,3,0:T(8,128)(2,1)}) tuple(%s, %d)
}
"""  # noqa: E501 (the compiler's lines; the slice as emitted for the 8B decode on v6e-64)


def test_a_slice_reads_its_slice_not_its_operand():
    """A top-level slice (the decode's 16-slot window of a [32, 256, 1024, 1, 128] own
    K/V cache, into VMEM, as the compiler emitted it for 8B on v6e-64) reads the window,
    2 x 32 x 256 x 16 x 128 bytes, not the whole cache; a dynamic-slice of one layer into
    HBM reads it and writes it: 2 x (2 x 256 x 1024 x 128) bytes, plus its 4 indices (the
    count had charged both the whole 2.1 GB cache)."""
    window = 2 * 32 * 256 * 16 * 128
    layer = 2 * 256 * 1024 * 128
    assert hlo_stats.module_stats(_SLICED).bytes == window + 2 * layer + 5 * 4
