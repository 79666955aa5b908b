"""LoRA (kjax.models.lora) against its references: the merged dense model, the base model
at initialization, PEFT's PyTorch LoRA on the same weights, finite differences, and the
grouped sampler on merged weights; every family, tiny random configs."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from kjax import sampling
from kjax.models import forward, lora
from kjax.models.lora import LoraConfig, Projection
from tests.models.hf_reference import kjax_from_hf, random_family_model

# One case per family, each with its extras on (biases, q/k norms, windows, tying).
FAMILIES = {
    "llama": ("llama", dict()),
    "qwen2": ("qwen2", dict(use_sliding_window=True, sliding_window=5, max_window_layers=1)),
    "qwen3": ("qwen3", dict(head_dim=6)),
    "mistral": ("mistral", dict(sliding_window=4, tie_word_embeddings=True)),
}
RANK, ALPHA = 3, 6.0
_forward = jax.jit(forward, static_argnums=1)


def _hf(name, seed=0):
    family, overrides = FAMILIES[name]
    return random_family_model(family, seed=seed, **overrides)


def _adapted(params, seed=0, targets=lora.ALL, b_std=0.3):
    """params with adapters whose B is random too (at init B = 0 would hide every error)."""
    cfg = LoraConfig(rank=RANK, alpha=ALPHA, targets=targets)
    out = lora.attach(params, cfg, jax.random.key(seed))
    rng = np.random.default_rng(seed)
    layers = dict(out["layers"])
    for name in lora.targets_of(out):
        b = layers[f"{name}_lora_b"]
        layers[f"{name}_lora_b"] = jnp.asarray(b_std * rng.normal(size=b.shape), b.dtype)
    return {**out, "layers": layers}


def _tokens(seed, B=3, S=9, V=11):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, V, size=(B, S)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[1, :3] = 0  # left padding
    return np.where(mask == 1, tokens, 0), mask


def test_config_refuses_dropout_and_unknown_targets():
    with pytest.raises(ValueError, match="dropout` must be 0"):
        LoraConfig(rank=4, dropout=0.1)
    with pytest.raises(ValueError, match="Projection"):
        LoraConfig(rank=4, targets=("q", "qkv"))
    with pytest.raises(ValueError, match="rank"):
        LoraConfig(rank=-1)
    assert LoraConfig(rank=4, targets="v,q").targets == (Projection.Q, Projection.V)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_logits_equal_merged_dense_model_and_base_at_init(name):
    model = kjax_from_hf(_hf(name, seed=1))
    params, config = model.params(), model.config
    tokens, mask = _tokens(1)
    real = mask.astype(bool)
    base = np.asarray(_forward(params, config, tokens, None, mask))
    # At initialization B = 0: the adapted model is the base model, bit for bit.
    fresh = lora.attach(params, LoraConfig(rank=RANK, alpha=ALPHA), jax.random.key(0))
    assert np.abs(np.asarray(fresh["layers"]["q_lora_a"])).max() > 0
    np.testing.assert_array_equal(np.asarray(_forward(fresh, config, tokens, None, mask)), base)
    adapted = _adapted(params, seed=2)
    ours = np.asarray(_forward(adapted, config, tokens, None, mask))
    merged = np.asarray(_forward(lora.merge(adapted), config, tokens, None, mask))
    assert np.abs(ours[real] - base[real]).max() > 1e-1  # the adapters change the model
    np.testing.assert_allclose(ours[real], merged[real], atol=2e-5, rtol=0)


def _peft_model(hf, params, targets):
    """PEFT's LoRA around hf, its lora_A / lora_B set to kjax's adapters (transposed)."""
    import peft

    cfg = peft.LoraConfig(
        r=RANK,
        lora_alpha=ALPHA,
        lora_dropout=0.0,
        target_modules=[lora.HF_MODULES[n].split(".")[-1] for n in targets],
    )
    model = peft.get_peft_model(hf, cfg).eval()
    state = lora.peft_tensors(params)
    missing = model.load_state_dict(
        {k.replace(".weight", ".default.weight"): torch.tensor(v) for k, v in state.items()},
        strict=False,
    )
    assert not missing.unexpected_keys
    assert not [k for k in missing.missing_keys if "lora_" in k]
    return model


@pytest.mark.parametrize(
    "name,targets",
    [
        ("llama", lora.ALL),
        ("qwen2", (Projection.Q, Projection.V)),
        ("qwen3", (Projection.O, Projection.DOWN)),
        ("mistral", (Projection.K, Projection.GATE, Projection.UP)),
    ],
)
def test_logits_match_peft_lora(name, targets):
    hf = _hf(name, seed=3)
    model = kjax_from_hf(hf)
    adapted = _adapted(model.params(), seed=3, targets=targets)
    tokens, mask = _tokens(3)
    ours = np.asarray(_forward(adapted, model.config, tokens, None, mask))
    peft_model = _peft_model(hf, adapted, [t.value for t in targets])
    positions = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
    with torch.no_grad():
        ref = peft_model(
            input_ids=torch.tensor(tokens, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        ).logits.numpy()
    real = mask.astype(bool)
    base = np.asarray(_forward(model.params(), model.config, tokens, None, mask))
    assert np.abs(ref[real] - base[real]).max() > 1e-1  # PEFT's adapters are live
    np.testing.assert_allclose(ours[real], ref[real], atol=2e-5, rtol=0)


def test_adapter_gradients_match_finite_differences():
    model = kjax_from_hf(_hf("qwen2", seed=4))
    params, config = model.params(), model.config
    adapted = _adapted(params, seed=4)
    trainable, frozen = lora.split(adapted)
    assert set(trainable["layers"]) == {f"{p.value}_lora_{x}" for p in lora.ALL for x in "ab"}
    tokens, mask = _tokens(4)
    weights = jnp.asarray(np.random.default_rng(4).normal(size=(3, 9, 11)), jnp.float32)

    def loss(t):
        logits = forward(lora.join(t, frozen), config, tokens, attention_mask=mask)
        return jnp.sum(jax.nn.log_softmax(logits) * weights * mask[..., None])

    grads = jax.jit(jax.grad(loss))(trainable)
    f = jax.jit(loss)
    rng = np.random.default_rng(5)
    # Directional derivatives along a random direction of all adapters, and along single
    # leaves (a 1-input and the 2-input o projection, A and B).
    for leaf in [None, "q_lora_a", "q_lora_b", "o_lora_a", "o_lora_b"]:
        direction = {
            "layers": {
                n: jnp.asarray(rng.normal(size=x.shape) if leaf in (None, n) else 0 * x, x.dtype)
                for n, x in trainable["layers"].items()
            }
        }
        norm = np.sqrt(sum(float(jnp.vdot(d, d)) for d in jax.tree.leaves(direction)))
        step = jax.tree.map(lambda d, norm=norm: 3e-2 * d / norm, direction)  # unit * eps
        plus = jax.tree.map(jnp.add, trainable, step)
        minus = jax.tree.map(jnp.subtract, trainable, step)
        fd = (float(f(plus)) - float(f(minus))) / 2
        pairs = zip(jax.tree.leaves(grads), jax.tree.leaves(step), strict=True)
        dot = sum(float(jnp.vdot(g, d)) for g, d in pairs)
        assert abs(dot) > 1e-3, leaf  # a gradient that is really there
        # float32 central differences: ~0.5% here; a wrong scale or layout is off by far more
        np.testing.assert_allclose(dot, fd, rtol=1e-2, err_msg=str(leaf))


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_sampler_with_adapters_is_token_identical_to_merged_weights(temperature):
    hf = _hf("qwen3", seed=6)
    model = kjax_from_hf(hf)
    adapted = _adapted(model.params(), seed=6)
    rng = np.random.default_rng(6)
    mask = np.ones((3, 5), bool)
    mask[1, :2] = False
    prompts = np.where(mask, rng.integers(0, 11, size=(3, 5)), 0).astype(np.int32)
    greedy = temperature == 0.0

    def draw(params):
        return sampling.sample_params(
            params, prompts, mask, jax.random.key(7), jnp.float32(temperature or 1.0),
            config=model.config, n=4, max_new_tokens=12, greedy=greedy,
        )  # fmt: skip

    ours, merged, base = draw(adapted), draw(lora.merge(adapted)), draw(model.params())
    np.testing.assert_array_equal(np.asarray(ours.tokens), np.asarray(merged.tokens))
    np.testing.assert_allclose(ours.logprobs, merged.logprobs, atol=1e-5)
    # The sampler really reads the adapters: the base model writes other tokens.
    assert np.mean(np.asarray(ours.tokens) != np.asarray(base.tokens)) > 0.2


def test_split_join_and_merge_leave_a_plain_model_unchanged():
    params = kjax_from_hf(_hf("llama")).params()
    assert lora.split(params) == (params, {})
    assert lora.merge(params) is params
    adapted = _adapted(params)
    trainable, frozen = lora.split(adapted)
    assert jax.tree.structure(lora.join(trainable, frozen)) == jax.tree.structure(adapted)
    assert "lora_scale" in frozen["layers"] and not lora.has_adapters(frozen)
    with pytest.raises(ValueError, match="already carry"):
        lora.attach(adapted, LoraConfig(rank=2), jax.random.key(0))
    assert lora.fingerprint(frozen) == lora.fingerprint(lora.split(_adapted(params, 9))[1])
    moved = {**frozen, "final_norm": frozen["final_norm"] + 1e-3}
    assert lora.fingerprint(moved) != lora.fingerprint(frozen)


def test_fingerprint_is_the_same_on_any_mesh_and_sees_every_element():
    """The device-side fingerprint: equal for the base sharded over 8 devices (each summing
    its own shards) and on one; changed by a swap of two elements (the index enters each
    term) and by one flipped bit; a checkpoint's pre-2026-12-06 digest still matches."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    rng = np.random.default_rng(0)
    frozen = {  # a base's kinds of leaves: float32, bfloat16, int, and the adapters' scale
        "embed": jnp.asarray(rng.normal(size=(16, 8)), jnp.bfloat16),
        "layers": {"q": jnp.asarray(rng.normal(size=(2, 8, 4)), jnp.float32),
                   "lora_scale": jnp.full((2,), 2.0)},
        "final_norm": jnp.asarray(rng.normal(size=(8,)), jnp.float32),
        "positions": jnp.arange(12, dtype=jnp.int32),
    }  # fmt: skip
    ident = lora.fingerprint(frozen)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "b"))

    def spread(x):  # the first two axes over the mesh where they divide
        spec = [None] * x.ndim
        for i, (axis, size) in enumerate(zip(("a", "b"), (2, 4), strict=True)):
            if i < x.ndim and x.shape[i] % size == 0:
                spec[i] = axis
        return jax.device_put(x, NamedSharding(mesh, P(*spec)))

    sharded = jax.tree.map(spread, frozen)
    assert any(len(x.sharding.device_set) > 1 for x in jax.tree.leaves(sharded))
    assert lora.fingerprint(sharded) == ident
    w = np.asarray(frozen["layers"]["q"]).reshape(-1)
    swapped = w.copy()
    swapped[[0, 1]] = w[[1, 0]]
    assert w[0] != w[1]
    flipped = w.copy().view(np.uint32)
    flipped[13] ^= 1
    for other in (swapped, flipped.view(w.dtype)):
        q = jnp.asarray(other.reshape(2, 8, 4))
        changed = {**frozen, "layers": {**frozen["layers"], "q": q}}
        assert lora.fingerprint(changed) != ident
    legacy = lora._host_fingerprint(frozen)
    assert lora.same_base(legacy, frozen, ident) and lora.same_base(ident, frozen, ident)
    assert not lora.same_base(None, frozen, ident)
    assert not lora.same_base(lora._host_fingerprint(changed), frozen, ident)


def test_save_hf_writes_merged_model_and_adapter_peft_loads(tmp_path):
    import peft
    import transformers

    hf = _hf("qwen2", seed=8)
    model = kjax_from_hf(hf)
    adapted = _adapted(model.params(), seed=8, targets=(Projection.Q, Projection.O, Projection.UP))
    lora.save_hf(adapted, model.config, str(tmp_path), base_model="tiny-qwen2")
    tokens, mask = _tokens(8)
    ours = np.asarray(_forward(adapted, model.config, tokens, None, mask))
    positions = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
    inputs = dict(
        input_ids=torch.tensor(tokens, dtype=torch.long),
        attention_mask=torch.tensor(mask, dtype=torch.long),
        position_ids=torch.tensor(positions, dtype=torch.long),
    )
    loaded = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    with torch.no_grad():
        via_peft = loaded(**inputs).logits.numpy()
        via_merged = merged(**inputs).logits.numpy()
    real = mask.astype(bool)
    np.testing.assert_allclose(ours[real], via_peft[real], atol=2e-5, rtol=0)
    np.testing.assert_allclose(ours[real], via_merged[real], atol=2e-5, rtol=0)


def _dot_output_shapes(fn, *args):
    """The result shape of every dot_general of fn's lowered module (StableHLO: before XLA,
    which adds no dot)."""
    text = jax.jit(fn).lower(*args).as_text()
    found = re.findall(r"stablehlo\.dot_general.*-> tensor<([\dx]*)x?f32>", text)
    return {tuple(int(d) for d in dims.split("x") if d) for dims in found}


def test_adapter_update_forms_no_weight_gradient_of_the_frozen_base():
    """The LoRA backward computes no x^T dy of a frozen weight (the matmuls XLA:CPU runs off
    its fast path); the full update's does, which shows the check can see them."""
    model = kjax_from_hf(_hf("llama", seed=6))
    params, config = model.params(), model.config
    trainable, frozen = lora.split(_adapted(params, seed=6))
    tokens, mask = _tokens(6)  # 27 rows: no weight dimension of this model

    def loss(p):
        return jnp.sum(jax.nn.log_softmax(forward(p, config, tokens, attention_mask=mask)))

    base = {x.reshape(x.shape[0], -1, x.shape[-1]).shape[1:] for x in params["layers"].values()
            if x.ndim >= 3}  # fmt: skip
    base |= {params["embed"].shape} | {s[::-1] for s in base | {params["embed"].shape}}
    assert base & _dot_output_shapes(jax.grad(loss), params)  # the full update forms them
    adapters = _dot_output_shapes(jax.grad(lambda t: loss(lora.join(t, frozen))), trainable)
    assert adapters and not base & adapters
