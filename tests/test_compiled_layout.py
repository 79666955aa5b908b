"""What the TPU compiler makes of kjax's sharded programs on small v5e topologies
(compiled here on the CPU; needs libtpu): the decode step reads only the live window of
its own K/V cache, and the training forward gathers weights, not activations, over fsdp."""

import dataclasses
import re

import jax
import pytest

from kjax import hlo_stats, sampler_layout, sampling, scale, sharding
from kjax.models.config import LlamaConfig
from kjax.rl.config import ArithConfig, ModelConfig, TrainConfig
from kjax.sampler_weights import SamplerWeights

pytestmark = pytest.mark.skipif(
    scale.libtpu_missing() is not None,
    reason=f"{scale.libtpu_missing()}: no TPU compiler to compile for a TPU topology",
)

CONFIG = LlamaConfig(
    vocab_size=32,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    tie_embeddings=True,
    eos_ids=(1,),
    max_position_embeddings=64,
)
CFG = TrainConfig(
    batch_prompts=8,
    samples=4,
    max_new_tokens=20,  # own cache of 19 slots; decode windows 16 and 19
    task=ArithConfig(max_prompt_tokens=8),
    model=ModelConfig(hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=128),
)
# Ops that move no cache data (or only the slot they write), and the memory-space
# assignment's own copies between HBM and on-chip memory.
_NOT_A_COPY = {"parameter", "get-tuple-element", "tuple", "while", "bitcast", "copy-start",
               "copy-done", "slice-start", "slice-done", "custom-call",
               "dynamic-update-slice"}  # fmt: skip


def _compiled_text(monkeypatch, name, compile_fn, *args):
    texts = {}

    def keep(label, fn, *a, **_):  # compile_one's mesh= and kernel_cost=
        texts[label] = fn.lower(*a).compile().as_text()

    monkeypatch.setattr(scale.planner, "compile_one", keep)
    compile_fn(*args)
    return texts[name]


def _roots_in_place(comps, roots, comp) -> bool:
    """Whether a fusion's root is an in-place cache write (a dynamic-update-slice, or a
    tuple of them)."""
    by_name = {i.name: i for i in comps[comp]}
    root = by_name[roots[comp]]
    parts = [by_name[o] for o in root.operands] if root.op == "tuple" else [root]
    return all(p.op == "dynamic-update-slice" for p in parts)


def _whole_cache_copies(text: str, length: int) -> list[str]:
    """Instructions outside fusions whose result holds a whole cache length `length`
    (a copy of the cache: slicing, relayout, conversion), other than in-place writes."""
    comps, roots, _ = hlo_stats._parse(text)
    fused = {
        c
        for instrs in comps.values()
        for i in instrs
        if i.op == "fusion"
        for c in re.findall(r"calls=%([\w.\-]+)", i.attrs)
    }
    found = []
    for comp, instrs in comps.items():
        if comp in fused:
            continue
        for i in instrs:
            if i.op in _NOT_A_COPY or not any(
                length in dims and len(dims) >= 4 for _, dims in hlo_stats._arrays(i.type)
            ):
                continue
            called = re.search(r"calls=%([\w.\-]+)", i.attrs)
            if i.op == "fusion" and called and _roots_in_place(comps, roots, called.group(1)):
                continue
            found.append(f"{i.op} {i.type}")
    return found


def test_decode_step_reads_only_the_live_window_of_its_cache(monkeypatch):
    """The sampler's decode step (its while-loop body, as the planner compiles it) at its
    first window, 16 of 39 slots (48 on TPU, sampling.own_slots; a length no other array
    has), on v5e:2x2 at fsdp 2 x tensor 2: no instruction copies a layer's whole own
    cache [B*N, 48, K, E] (nor the whole [L, ...] cache) other than the in-place write of
    the fed token; before, the layer scan sliced each layer's whole cache out and laid it
    out again (a bf16 copy of all of it here), every step."""
    cfg = dataclasses.replace(CFG, max_new_tokens=40)
    window, slots = 16, sampling.own_slots(cfg.max_new_tokens, tpu=True)
    assert slots == 48
    assert [w for w, _ in sampling._phases(cfg.max_new_tokens, slots)] == [window, 32, 48]
    mesh = sharding.make_mesh(1, 2, 2, devices=scale.topology_devices("v5e:2x2"))
    params = scale.abstract_params(CONFIG, scale.param_dtype(cfg), mesh)
    shape = scale.Shape.of(cfg)
    name = f"decode@{window}"
    text = _compiled_text(
        monkeypatch, name, scale.compile_decode, cfg, CONFIG, mesh, params, shape, window
    )
    assert _whole_cache_copies(text, slots) == []
    # In the trainer's layout the step gathers the layers' weights over fsdp, every step.
    rules = sampler_layout.weight_rules(SamplerWeights.TENSOR)
    assert _weight_gathers(text, scale.abstract_params(CONFIG, scale.param_dtype(cfg), mesh, rules))


def test_decode_step_in_the_sampler_layout_gathers_no_weights(monkeypatch):
    """The same step with the weights in the sampler's own layout (SamplerWeights.TENSOR:
    tensor only, resharded once per rollout, kjax.sampler_layout): no weight is gathered
    (the test above finds them in the trainer's layout), no whole-cache copy."""
    cfg = dataclasses.replace(CFG, max_new_tokens=40)
    mesh = sharding.make_mesh(1, 2, 2, devices=scale.topology_devices("v5e:2x2"))
    rules = sampler_layout.weight_rules(SamplerWeights.TENSOR)
    params = scale.abstract_params(CONFIG, scale.param_dtype(cfg), mesh, rules)
    text = _compiled_text(monkeypatch, "decode@16", scale.compile_decode, cfg, CONFIG, mesh,
                          params, scale.Shape.of(cfg), 16)  # fmt: skip
    assert _weight_gathers(text, params) == []
    assert _whole_cache_copies(text, sampling.own_slots(cfg.max_new_tokens, tpu=True)) == []


# A model whose arrays fill the TPU's (8, 128) tiles (head_dim 128, 64 rows per chip) and
# whose stacked weights and own K/V cache exceed on-chip memory, as a real model's do
# (where a whole [L, ...] array fits, the compiler prefetches all of it at every layer);
# nothing is allocated, the compile time is a small model's.
FLOOR_CONFIG = dataclasses.replace(CONFIG, vocab_size=8192, hidden_size=1024,
                                   intermediate_size=8192, num_layers=8, num_heads=8,
                                   head_dim=128, tie_embeddings=False,
                                   max_position_embeddings=2048)  # fmt: skip
FLOOR_CFG = dataclasses.replace(CFG, batch_prompts=32, max_new_tokens=1024,
                                task=ArithConfig(max_prompt_tokens=64),
                                model=dataclasses.replace(CFG.model, dtype="bfloat16"))  # fmt: skip


def _weight_gathers(text: str, gathered) -> list[str]:
    """All-gathers whose result is a weight as each chip holds it in the layout `gathered`
    (ShapeDtypeStructs: the tensor-only layout, what a gather over fsdp makes), whole or
    one layer of it."""
    shapes = {tuple(x.sharding.shard_shape(x.shape)) for x in jax.tree.leaves(gathered)}
    shapes |= {s[1:] for s in shapes} | {(1, *s[1:]) for s in shapes}
    return [
        i.type
        for instrs in hlo_stats.computations(text).values()
        for i in instrs
        if i.op in ("all-gather", "all-gather-start")
        and any(tuple(d) in shapes for _, d in hlo_stats._arrays(i.type))
    ]


@pytest.mark.slow  # three compiles, ~20 s on 2 cores (90 s under load)
def test_decode_step_moves_within_1_3x_of_its_floor_and_gathers_no_weights(monkeypatch):
    """The decode step on v5e:2x2 at fsdp 2 x tensor 2 with the sampler's weights in their
    own layout (SamplerWeights.TENSOR, which AUTO picks here): its HBM bytes (hlo_stats)
    within [1, 1.3] x scale.decode_floor (the tensor shard of the weights + the live K/V)
    at its first and last window (16 and 1024 of 1023 slots, padded to 1024 on TPU), and
    no weight all-gathered; in the trainer's layout the same step all-gathers
    every layer's weights over fsdp, every step."""
    mesh = sharding.make_mesh(1, 2, 2, devices=scale.topology_devices("v5e:2x2"))
    shape, dtype = scale.Shape.of(FLOOR_CFG), FLOOR_CFG.model.compute_dtype
    pdtype = dtype  # bfloat16 weights, as loaded ones are (a float32 dot converts them on TPU)
    train = scale.abstract_params(FLOOR_CONFIG, pdtype, mesh)
    hbm, held = scale.CHIPS["v5e"].hbm_bytes, scale.per_chip_bytes(train)
    weights = sampler_layout.resolve_weights(
        SamplerWeights.AUTO, train, FLOOR_CONFIG, mesh, cache_bytes=0, resident_bytes=held,
        hbm_bytes=hbm,
    )  # fmt: skip
    assert weights is SamplerWeights.TENSOR
    params = scale.abstract_params(FLOOR_CONFIG, pdtype, mesh, sampler_layout.weight_rules(weights))
    windows = [w for w, _ in sampling._phases(shape.T, sampling.own_slots(shape.T, tpu=True))]
    assert (windows[0], windows[-1]) == (16, 1024)
    for window in (windows[0], windows[-1]):
        name = f"decode@{window}"
        text = _compiled_text(monkeypatch, name, scale.compile_decode, FLOOR_CFG, FLOOR_CONFIG,
                              mesh, params, shape, window)  # fmt: skip
        floor = sum(scale.decode_floor(FLOOR_CONFIG, shape, window, mesh, params, dtype).values())
        moved = hlo_stats.module_stats(text).bytes
        assert floor <= moved <= 1.3 * floor, (window, moved / floor)
        assert _weight_gathers(text, params) == []
    text = _compiled_text(monkeypatch, "decode@16", scale.compile_decode, FLOOR_CFG,
                          FLOOR_CONFIG, mesh, train, shape, 16)  # fmt: skip
    assert _weight_gathers(text, params)


def _saved_stacks(text: str, L: int, D: int) -> set[tuple[int, ...]]:
    """Shapes [L, ..., D] of the compiled program's arrays: the layer scan's per-layer
    saves of a [.., D] activation (its input, the residual after attention)."""
    return {
        tuple(d)
        for instrs in hlo_stats.computations(text).values()
        for i in instrs
        for _, d in hlo_stats._arrays(i.type)
        if len(d) == 4 and d[0] == L and d[-1] == D
    }


@pytest.mark.slow  # two TPU compiles, ~6-11 s on 2 cores
def test_training_forward_saves_its_layer_inputs_split_over_tensor():
    """The update's forward and backward (completion log-probs through the chunked head)
    on v5e:2x2 at fsdp 2 x tensor 2, one prompt group per chip: the layer scan keeps each
    layer's input and its residual after attention split over tensor along the S + N*T
    = 8 + 4*4 positions, [L, 1, 12, D] per chip, and no [L, 1, 24, D] stack.
    Inside sharding.sequence_split(True) (rl.sequence_parallel). Outside it (the default
    program) the stack is whole on every tensor device: 70B CodeContests on v5p-128 kept
    bf16[80,1,34304,8192], 41.9 GiB per chip, and did not fit."""
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from kjax.rl import forward

    c = dataclasses.replace(CONFIG, intermediate_size=192)  # gate, up [.., 96]: not D-wide
    mesh = sharding.make_mesh(1, 2, 2, devices=scale.topology_devices("v5e:2x2"))
    params = scale.abstract_params(c, jnp.float32, mesh)
    B, S, N, T = 2, 8, 4, 4
    rows = NamedSharding(mesh, P(("data", "fsdp")))
    prompts = jax.ShapeDtypeStruct((B, S), jnp.int32, sharding=rows)
    pmask = jax.ShapeDtypeStruct((B, S), jnp.bool_, sharding=rows)
    tokens = jax.ShapeDtypeStruct((B, N, T), jnp.int32, sharding=rows)

    def stacks(on=True):
        def loss(params, prompts, pmask, tokens):
            with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), sharding.sequence_split(on):
                stats = forward.completion_logprobs(params, c, prompts, pmask, tokens)
            return jnp.sum(stats.logprobs)

        step = jax.jit(jax.grad(loss))
        text = step.lower(params, prompts, pmask, tokens).compile().as_text()
        return _saved_stacks(text, c.num_layers, c.hidden_size)

    L, D = c.num_layers, c.hidden_size
    split, whole = (L, 1, (S + N * T) // 2, D), (L, 1, S + N * T, D)
    got = stacks()
    assert split in got and whole not in got, got
    before = stacks(on=False)  # rl.sequence_parallel off, the default
    assert whole in before and split not in before, before
