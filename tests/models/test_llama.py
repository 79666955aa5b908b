"""kjax Llama vs transformers' LlamaForCausalLM on tiny random configs (float32, 1e-5)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kjax.models import Llama, LlamaConfig, decode_step, forward, prefill
from kjax.models import llama as L
from kjax.models.weights import hf_to_params
from tests.models.hf_reference import hf_logits, kjax_from_hf, random_hf_model

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}

CONFIGS = {
    "mha": dict(num_key_value_heads=4),
    "gqa": dict(num_key_value_heads=2),
    "mqa": dict(num_key_value_heads=1),
    "tied": dict(tie_word_embeddings=True),
    # head_dim 16 gives wavelengths on every side of llama3's blending band.
    "llama3_rope": dict(
        hidden_size=32,
        head_dim=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        rope_parameters=LLAMA3_ROPE,
    ),
    "head_dim_not_d_over_h": dict(head_dim=6),
}


@jax.jit
def _run(model, tokens, mask=None):
    return model(tokens, attention_mask=mask)


def _tokens(rng, B, S, V=11):
    return rng.integers(0, V, size=(B, S)).astype(np.int32)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_match_transformers(name):
    hf = random_hf_model(seed=len(name), **CONFIGS[name])
    model = kjax_from_hf(hf)
    tokens = _tokens(np.random.default_rng(0), 2, 40)
    ours = np.asarray(_run(model, tokens))
    ref = hf_logits(hf, tokens)
    assert np.abs(ref).max() > 1.0  # logits large enough for 1e-5 to be a real test
    np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=0)


def test_left_padding_matches_transformers_and_unpadded_rows():
    hf = random_hf_model(seed=3)
    model = kjax_from_hf(hf)
    rng = np.random.default_rng(1)
    tokens = _tokens(rng, 3, 12)
    mask = np.ones_like(tokens)
    mask[1, :4] = 0
    mask[2, :11] = 0
    tokens = np.where(mask == 1, tokens, 0)
    ours = np.asarray(_run(model, tokens, mask))
    ref = hf_logits(hf, tokens, mask)
    real = mask.astype(bool)
    np.testing.assert_allclose(ours[real], ref[real], atol=1e-5, rtol=0)
    # A padded row equals the same prompt run alone without padding.
    alone = np.asarray(_run(model, tokens[1:2, 4:]))
    np.testing.assert_allclose(ours[1, 4:], alone[0], atol=1e-5, rtol=0)


def test_kv_cache_decode_equals_full_forward():
    hf = random_hf_model(seed=4, num_key_value_heads=1)
    model = kjax_from_hf(hf)
    params, config = model.params(), model.config
    rng = np.random.default_rng(2)
    B, S, T = 2, 5, 7
    tokens = _tokens(rng, B, S + T)
    mask = np.ones_like(tokens)
    mask[0, :2] = 0  # left padding in the prompt of row 0
    full = np.asarray(jax.jit(forward, static_argnums=1)(params, config, tokens, None, mask))
    logits, cache = jax.jit(prefill, static_argnums=(1, 4))(
        params, config, tokens[:, :S], mask[:, :S], S + T
    )
    np.testing.assert_allclose(logits[1], full[1, :S], atol=1e-5, rtol=0)
    step = jax.jit(decode_step, static_argnums=1)
    for t in range(S, S + T):
        next_logits, cache = step(params, config, jnp.asarray(tokens[:, t]), cache)
        np.testing.assert_allclose(next_logits, full[:, t], atol=1e-5, rtol=0)


def test_merge_attention_over_key_segments_equals_joint_softmax():
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.normal(size=(2, 3, 4, 8)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(2, 9, 2, 8)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(2, 9, 2, 8)), jnp.float32)
    mask = jnp.asarray(rng.random((2, 3, 9)) < 0.7).at[:, :, 0].set(True)
    attention = jax.jit(L.attention, static_argnames="with_lse")
    joint = attention(q, k, v, mask)
    parts = [
        attention(q, k[:, s], v[:, s], mask[:, :, s], with_lse=True)
        for s in (slice(0, 4), slice(4, 9))
    ]
    np.testing.assert_allclose(L.merge_attention(parts), joint, atol=1e-6, rtol=0)


def test_bfloat16_compute_is_close_and_returns_float32():
    hf = random_hf_model(seed=5, std=0.1)
    tokens = _tokens(np.random.default_rng(4), 2, 16)
    f32 = _run(kjax_from_hf(hf), tokens)
    bf16 = _run(kjax_from_hf(hf, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16), tokens)
    assert bf16.dtype == jnp.float32
    assert 0 < float(jnp.abs(bf16 - f32).max()) < 0.1


def test_remat_gives_same_loss_and_gradients():
    hf = random_hf_model(seed=6)
    tokens = _tokens(np.random.default_rng(5), 2, 10)

    def loss_and_grad(remat):
        graphdef, state = nnx.split(kjax_from_hf(hf, remat=remat))

        def loss(state):  # a pure function of the parameters
            logits = nnx.merge(graphdef, state)(tokens)
            return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])

        return jax.jit(jax.value_and_grad(loss))(state)

    (l0, g0), (l1, g1) = loss_and_grad(False), loss_and_grad(True)
    np.testing.assert_allclose(l0, l1, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), g0, g1)
    assert float(jnp.abs(nnx.to_pure_dict(g0)["layers"]["q"]).max()) > 0


def test_random_init_shapes_and_axes():
    config = LlamaConfig(
        vocab_size=11,
        hidden_size=16,
        intermediate_size=24,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        head_dim=4,
        tie_embeddings=True,
    )
    # unsafe_rbg: threefry's initializers take ~1 s each to compile on a small CPU.
    model = Llama(config, rngs=nnx.Rngs(params=jax.random.key(0, impl="unsafe_rbg")))
    shapes = jax.tree.map(jnp.shape, model.params())
    assert shapes["layers"]["q"] == (3, 16, 4, 4) and shapes["layers"]["o"] == (3, 4, 4, 16)
    assert "lm_head" not in shapes
    assert _run(model, jnp.zeros((1, 5), jnp.int32)).shape == (1, 5, 11)


def _nll(logits, tokens, mask):
    """Mean next-token NLL over real (mask=1) target positions."""
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    w = mask[:, 1:].astype(jnp.float32)
    return -jnp.sum(picked * w) / jnp.sum(w)


def _torch_grads_in_kjax_layout(hf, config):
    """PyTorch's .grad of every parameter, through the weights' name map (gradients map
    to kjax's layout exactly as the weights do: reshapes and transposes)."""
    grads = {k: p.grad.detach().numpy() for k, p in hf.named_parameters()}
    if config.tie_embeddings:  # one tensor in torch: its grad holds both uses
        grads.pop("lm_head.weight", None)
    return hf_to_params(grads, config)


@pytest.mark.parametrize("name", ["gqa", "tied"])
def test_gradients_match_transformers(name):
    """The default backward (named residuals, elementwise recompute) against PyTorch's
    autograd: every parameter's gradient, left-padded rows included."""
    import torch

    hf = random_hf_model(seed=8, **CONFIGS[name])
    rng = np.random.default_rng(9)
    tokens = _tokens(rng, 3, 9)
    mask = np.ones_like(tokens)
    mask[1, :3] = 0  # left padding
    positions = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
    model = kjax_from_hf(hf)
    params = model.params()

    def loss(p):
        return _nll(forward(p, model.config, tokens, attention_mask=mask), tokens, mask)

    grads = jax.jit(jax.grad(loss))(params)

    hf.zero_grad(set_to_none=True)
    out = hf(
        input_ids=torch.tensor(tokens, dtype=torch.long),
        attention_mask=torch.tensor(mask, dtype=torch.long),
        position_ids=torch.tensor(positions, dtype=torch.long),
    )
    t = torch.tensor(tokens, dtype=torch.long)
    logp = torch.log_softmax(out.logits[:, :-1].double(), dim=-1)
    picked = logp.gather(-1, t[:, 1:, None])[..., 0]
    w = torch.tensor(mask[:, 1:], dtype=torch.float64)
    (-(picked * w).sum() / w.sum()).backward()
    ref = _torch_grads_in_kjax_layout(hf, model.config)
    flat, flat_ref = jax.tree.leaves_with_path(grads), dict(jax.tree.leaves_with_path(ref))
    for path, g in flat:
        r = np.asarray(flat_ref[path])
        scale = float(np.abs(r).max())
        assert scale > 1e-4, path  # every parameter gets a gradient
        np.testing.assert_allclose(np.asarray(g), r, atol=2e-5 * scale, err_msg=str(path))


def test_backward_keeps_only_the_named_residuals():
    """The default backward's temporaries are well below plain autodiff of the same scan
    (which stacks every intermediate), and its gradients are the same."""
    config = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=256, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=16)  # fmt: skip
    rng = np.random.default_rng(3)
    shapes = jax.eval_shape(lambda: Llama(config, rngs=nnx.Rngs(0)).params())
    params = jax.tree.map(lambda a: rng.normal(0, 0.2, a.shape).astype(np.float32), shapes)
    tokens = _tokens(rng, 4, 32, V=32)

    def plain(p):  # the same blocks under a bare lax.scan
        mask = jnp.tril(jnp.ones((32, 32), bool))[None]
        cos, sin = L.rope_tables(config, jnp.broadcast_to(jnp.arange(32), (4, 32)))

        def block(x, layer):
            q, k, v = L.layer_qkv(layer, config, x, cos, sin)
            return L.layer_out(layer, config, x, L.attention(q, k, v, mask)), None

        x, _ = jax.lax.scan(block, L.embed(p, tokens), p["layers"])
        return jnp.sum(L.unembed(p, config, x) ** 2)

    def default(p):
        return jnp.sum(forward(p, config, tokens) ** 2)

    compiled = {f.__name__: jax.jit(jax.grad(f)).lower(params).compile() for f in (plain, default)}
    temp = {k: c.memory_analysis().temp_size_in_bytes for k, c in compiled.items()}
    assert temp["default"] < 0.7 * temp["plain"], temp

    def close(a, b):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.abs(b).max()))

    jax.tree.map(close, compiled["default"](params), compiled["plain"](params))


def test_long_attention_recomputes_probabilities_with_the_same_gradients(monkeypatch):
    """From RECOMPUTE_PROBS_AT score entries on, attention's backward recomputes the
    probabilities instead of saving them: the same values and gradients, bit for bit, and
    no [.., S, T] float32 residual left in the saved ones."""
    from kjax.models import llama as llama_lib

    rng = np.random.default_rng(0)
    B, S, T, H, K, E = 2, 8, 8, 4, 2, 4  # E != T: only the probabilities end in (S, T)
    q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32)
               for s in ((B, S, H, E), (B, T, K, E), (B, T, K, E)))  # fmt: skip
    mask = jnp.tril(jnp.ones((S, T), bool))[None].at[0, :, :3].set(False)  # padded row 0
    w = jnp.asarray(rng.normal(size=(B, S, H, E)), jnp.float32)

    def loss(q, k, v):
        out, lse = llama_lib.attention(q, k, v, mask, with_lse=True)
        return jnp.sum(out * w) + jnp.sum(jnp.sin(lse))

    def run():
        value, grads = jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)
        saved = jax.tree.leaves(jax.vjp(loss, q, k, v)[1])  # the vjp's residual arrays
        return value, grads, saved

    kept = run()
    monkeypatch.setattr(llama_lib, "RECOMPUTE_PROBS_AT", 1)
    recomputed = run()
    assert kept[0] == recomputed[0]
    for a, b in zip(kept[1], recomputed[1], strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    def square(saved):
        return [r for r in saved if r.shape[-2:] == (S, T) and r.dtype == jnp.float32]

    assert square(kept[2]) and not square(recomputed[2])
