"""The attention kernels (kjax/models/attention.py) against the jnp reference on CPU: splash
in Pallas interpret mode and the cuDNN path's jax.nn.dot_product_attention call with its
XLA implementation; forward and gradients, with prompt padding, GQA and splash's block
padding. Then the kernel in kjax's update, compiled for a v5e:2x2 slice."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kjax import sampling, scale
from kjax.models import attention, llama
from kjax.models.config import AttentionBackend, LlamaConfig
from kjax.rl import forward

KERNELS = (AttentionBackend.SPLASH, AttentionBackend.CUDNN)
CONFIG = LlamaConfig(
    vocab_size=13, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=8, attention=AttentionBackend.JNP,
)  # fmt: skip


def _reference_mask(prompt_mask, n, t):
    """[B,L,L] bool: the shared-prompt mask spelled out (query i, key j)."""
    S = prompt_mask.shape[1]
    L = S + n * t
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    block = lambda x: np.where(x < S, -1 - x, (x - S) // max(t, 1))  # noqa: E731
    structure = (j <= i) & ((j < S) | (block(i) == block(j)))
    pad = np.asarray(prompt_mask, bool)
    real = np.concatenate([pad, np.ones((len(pad), n * t), bool)], 1)
    return jnp.asarray(structure[None] & real[:, None, :])


SLOW = pytest.mark.slow  # interpret mode compiles each kernel body: 10-60 s on 2 cores


@pytest.mark.parametrize("backend", KERNELS, ids=lambda b: b.value)
@pytest.mark.parametrize(
    "S,n,t", [(20, 3, 12), pytest.param(40, 0, 0, marks=SLOW)], ids=["update", "prefill"]
)
def test_kernel_equals_masked_jnp_attention(backend, S, n, t):
    """Values and q/k/v gradients of the real rows, float32, to 1e-5; L = 56 and 40 are
    not multiples of splash's 128-wide blocks, so its padding is exercised too."""
    B, H, K, E = 2, 4, 2, 8
    L = S + n * t
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (B, L, H, E))
    k, v = (jax.random.normal(key, (B, L, K, E)) for key in keys[1:3])
    prompt_mask = jnp.arange(S)[None] >= jnp.array([[3], [0]])  # row 0 left-padded
    real = jnp.concatenate([prompt_mask, jnp.ones((B, n * t), bool)], 1)
    w = jax.random.normal(keys[3], (B, L, H, E)) * real[..., None, None]

    def loss(fn, q, k, v):
        out = fn(q, k, v)
        return jnp.sum(w * out), out

    mask = _reference_mask(prompt_mask, n, t)
    ref = jax.value_and_grad(lambda *a: loss(lambda *b: llama.attention(*b, mask), *a),
                             argnums=(0, 1, 2), has_aux=True)  # fmt: skip
    run = lambda *b: attention.grouped_attention(backend, *b, prompt_mask, n, t)  # noqa: E731
    got = jax.value_and_grad(lambda *a: loss(run, *a), argnums=(0, 1, 2), has_aux=True)
    (_, out_ref), g_ref = jax.jit(ref)(q, k, v)
    (_, out), g = jax.jit(got)(q, k, v)
    np.testing.assert_allclose(out * real[..., None, None], out_ref * real[..., None, None],
                               atol=1e-5)  # fmt: skip
    for a, b in zip(g, g_ref, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5 * float(jnp.max(jnp.abs(b))))


@pytest.mark.parametrize("backend", KERNELS, ids=lambda b: b.value)
@pytest.mark.parametrize("with_grads", [False, pytest.param(True, marks=SLOW)])
def test_update_log_probs_match_jnp(backend, with_grads):
    """completion_logprobs (the update's forward, every layer through the kernel) and, in
    the slow tier, the parameter gradients of a PG-like sum, against the JNP backend's
    LSE-merged path (the default tier runs one layer, forward only)."""
    config = CONFIG if with_grads else dataclasses.replace(CONFIG, num_layers=1)
    params = llama.Llama(config, rngs=nnx.Rngs(params=jax.random.key(0, impl="unsafe_rbg")))
    params = params.params()
    B, S, N, T = 2, 12, 2, 10
    keys = jax.random.split(jax.random.key(1), 3)
    prompts = jax.random.randint(keys[0], (B, S), 0, CONFIG.vocab_size)
    prompt_mask = jnp.arange(S)[None] >= jnp.array([[4], [0]])
    tokens = jax.random.randint(keys[1], (B, N, T), 0, CONFIG.vocab_size)
    adv = jax.random.normal(keys[2], (B, N, T))

    def objective(p, config):
        lp = forward.completion_logprobs(p, config, prompts, prompt_mask, tokens).logprobs
        return jnp.sum(adv * lp), lp

    kernel = dataclasses.replace(config, attention=backend)
    if not with_grads:
        ref, got = (jax.jit(objective, static_argnums=1)(params, c)[1] for c in (config, kernel))
        np.testing.assert_allclose(got, ref, atol=1e-5)
        return
    grad = jax.jit(jax.value_and_grad(objective, has_aux=True), static_argnums=1)
    (_, lp_ref), g_ref = grad(params, config)
    (_, lp), g = grad(params, kernel)
    np.testing.assert_allclose(lp, lp_ref, atol=1e-5)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5 * float(jnp.max(jnp.abs(b))))


def test_prefill_through_splash_matches_jnp():
    config = dataclasses.replace(CONFIG, num_layers=1)
    params = llama.Llama(config, rngs=nnx.Rngs(params=jax.random.key(2, impl="unsafe_rbg")))
    params = params.params()
    prompts = jax.random.randint(jax.random.key(3), (2, 9), 0, config.vocab_size)
    prompt_mask = jnp.arange(9)[None] >= jnp.array([[2], [0]])
    splash = dataclasses.replace(config, attention=AttentionBackend.SPLASH)
    prefill = jax.jit(sampling.prefill, static_argnums=1)
    logits_ref, cache_ref = prefill(params, config, prompts, prompt_mask)
    logits, cache = prefill(params, splash, prompts, prompt_mask)
    np.testing.assert_allclose(logits, logits_ref, atol=1e-5)
    real = prompt_mask[None, :, :, None, None]  # K/V of padding slots are never read
    np.testing.assert_allclose(cache.k * real, cache_ref.k * real, atol=1e-5)
    np.testing.assert_allclose(cache.v * real, cache_ref.v * real, atol=1e-5)


def test_auto_is_the_jnp_reference_on_cpu():
    auto = dataclasses.replace(CONFIG, attention=AttentionBackend.AUTO)
    assert jax.default_backend() == "cpu" and attention.platform() == "cpu"
    for dtype in (jnp.float32, jnp.bfloat16):
        assert attention.resolve(auto, dtype, 1 << 16) is AttentionBackend.JNP
    for backend in (AttentionBackend.JNP, *KERNELS):
        assert attention.resolve(dataclasses.replace(CONFIG, attention=backend),
                                 jnp.float32, 8) is backend  # fmt: skip
    assert LlamaConfig.from_hf(CONFIG.to_hf()).attention is AttentionBackend.AUTO
    assert "attention" not in CONFIG.to_hf()
    # A run's identity (its workdir) changes only when the backend is named.
    from kjax.rl.config import ModelConfig, to_json

    assert "attention" not in to_json(ModelConfig())
    assert to_json(ModelConfig(attention="splash"))["attention"] == "splash"


def test_a_kernel_refuses_what_it_does_not_implement():
    windowed = dataclasses.replace(
        CONFIG, family="mistral", sliding_window=4, attention=AttentionBackend.SPLASH
    )
    with pytest.raises(ValueError, match="sliding windows"):
        attention.resolve(windowed, jnp.float32, 1024)
    auto = dataclasses.replace(windowed, attention=AttentionBackend.AUTO)
    assert attention.resolve(auto, jnp.float32, 1024) is AttentionBackend.JNP
    with pytest.raises(ValueError, match="attention='flash' must be one of auto, jnp"):
        dataclasses.replace(CONFIG, attention="flash")


# The TPU compile tests need libtpu, which `.[tpu]` installs (CI does, before the tests).
NEEDS_LIBTPU = pytest.mark.skipif(
    scale.libtpu_missing() is not None,
    reason="needs the TPU compiler: pip install -e '.[tpu]' (CI installs it)",
)


def _splash_update_inputs(fsdp: int, tensor: int):
    """(model config, TrainConfig, mesh, abstract state, abstract batch) of a tiny RL update
    with attention=splash (4 query heads, 2 kv heads) on a v5e:2x2 mesh 1 x fsdp x tensor."""
    from kjax import sharding
    from kjax.rl.config import ArithConfig, ModelConfig, TrainConfig
    from kjax.rl.optim import make_optimizer

    c = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=128, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=16, tie_embeddings=True,
                    eos_ids=(1,))  # fmt: skip
    cfg = TrainConfig(
        batch_prompts=8, samples=4, max_new_tokens=4, task=ArithConfig(max_prompt_tokens=8),
        model=ModelConfig(hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=128,
                          attention="splash"),
    )  # fmt: skip
    mesh = sharding.make_mesh(1, fsdp, tensor, devices=scale.topology_devices("v5e:2x2"))
    state = scale.abstract_state(
        scale.abstract_params(c, scale.param_dtype(cfg), mesh), make_optimizer(cfg.optimizer), mesh
    )
    shape = scale.Shape.of(cfg)
    return c, cfg, mesh, state, scale.abstract_batch(shape.B, shape.N, shape.S, shape.T, mesh)


@NEEDS_LIBTPU
def test_update_with_splash_compiles_for_v5e_2x2():
    """kjax's RL update with attention=splash, compiled by the TPU compiler for fsdp 2 x
    tensor 2: the forward kernel and both backward kernels are in the program, each on
    its chip's rows and heads ([4 rows, 2 heads, 128, 16] of B=8, H=4; shard_map), and
    AUTO picks splash there once rows reach KERNEL_MIN_LENGTH."""
    from kjax.rl.components import step_and_sampler

    c, cfg, mesh, state, batch = _splash_update_inputs(fsdp=2, tensor=2)
    step_fn, _ = step_and_sampler(cfg, c, mesh, state, type("Stops", (), {"stop_ids": (1,)}))
    hlo = step_fn.lower(state, batch, None, np.int32(cfg.objective.k)).compile().as_text()
    kernels = [line for line in hlo.splitlines() if '"tpu_custom_call"' in line]
    names = {name for line in kernels for name in ("mha_fwd", "mha_dq", "mha_dkv") if name in line}
    assert names == {"mha_fwd", "mha_dq", "mha_dkv"}
    assert any("f32[4,2,128,16]" in line for line in kernels)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        auto = dataclasses.replace(c, attention=AttentionBackend.AUTO)
        assert attention.platform() == "tpu"
        assert attention.resolve(auto, jnp.bfloat16, attention.KERNEL_MIN_LENGTH) is (
            AttentionBackend.SPLASH
        )
        assert attention.resolve(auto, jnp.bfloat16, 24) is AttentionBackend.JNP


def test_kv_weights_repeated_to_query_heads_only_where_tensor_cannot_split_them():
    """On a 1x1x4 mesh of CPU devices, 2 kv heads: the k and v weights (and biases, LoRA
    B) come back with 4 heads, one per tensor device (each kv head twice, for 4 or 8
    query heads alike), and the projection through them equals the plain projection's
    heads repeated. Tensor 2, which splits the kv heads, and no mesh leave the layer as
    it was."""
    from kjax import sharding

    D, H, K, E, r = 8, 4, 2, 3, 2
    rng = np.random.default_rng(0)
    layer = {
        "q": rng.normal(size=(D, H, E)).astype(np.float32),
        "k": rng.normal(size=(D, K, E)).astype(np.float32),
        "v": rng.normal(size=(D, K, E)).astype(np.float32),
        "k_bias": np.arange(K * E, dtype=np.float32).reshape(K, E),
        "v_lora_b": np.arange(r * K * E, dtype=np.float32).reshape(r, K, E),
    }
    x = rng.normal(size=(5, D))
    assert attention.kv_weights_per_query_head(layer, H, K) is layer  # no mesh
    devices = np.array(jax.devices()[:4])
    for tensor, expect in ((2, 1), (4, 2)):
        mesh = sharding.make_mesh(1, 4 // tensor, tensor, devices=devices)
        with jax.set_mesh(mesh):
            assert attention.kv_repeat(H, K) == expect
            assert attention.kv_repeat(2 * H, K) == expect  # one kv head per device
            out = jax.jit(lambda p: attention.kv_weights_per_query_head(p, H, K))(layer)
        if expect == 1:
            assert all(out[n].shape == layer[n].shape for n in layer)
            continue
        assert out["k"].shape == out["v"].shape == (D, H, E) and out["q"] is not None
        assert out["k_bias"].shape == (H, E) and out["v_lora_b"].shape == (r, H, E)
        assert tuple(out["k"].sharding.spec)[:2] == (None, "tensor")
        for name in ("k", "v"):
            got = np.einsum("nd,dhe->nhe", x, np.asarray(out[name]))
            ref = np.repeat(np.einsum("nd,dke->nke", x, np.asarray(layer[name])), H // K, axis=1)
            np.testing.assert_allclose(got, ref, rtol=1e-5)
        np.testing.assert_array_equal(out["k_bias"], np.repeat(layer["k_bias"], 2, axis=0))
        np.testing.assert_array_equal(out["v_lora_b"], np.repeat(layer["v_lora_b"], 2, axis=1))


@SLOW  # two TPU compiles: 17 s at load average 4 on 2 cores, 142 s at 20
@NEEDS_LIBTPU
def test_update_computes_one_kv_head_per_chip_where_tensor_exceeds_the_kv_heads(monkeypatch):
    """kjax's RL update with splash, 4 query heads and 2 kv heads, compiled for tensor 4
    (v5e:2x2, mesh 1x1x4). With the kv weights repeated to the query heads
    (kv_weights_per_query_head) every chip's k/v weight-gradient dots produce one head,
    [D, E] = [64, 16]; with the kv heads repeated only as activations inside the kernel
    call (the layer as it was, patched back here) the partitioner computed the whole
    [D, K, E] = [64, 2, 16] weight gradient on every chip, and the program's FLOPs per
    chip were higher (8B MATH on v5e-256 at tensor 32: 1.66x the analytic count)."""
    from kjax import hlo_stats
    from kjax.rl.components import step_and_sampler

    c, cfg, mesh, state, batch = _splash_update_inputs(fsdp=1, tensor=4)

    def compiled():
        step_fn, _ = step_and_sampler(cfg, c, mesh, state, type("Stops", (), {"stop_ids": (1,)}))
        hlo = step_fn.lower(state, batch, None, np.int32(cfg.objective.k)).compile().as_text()
        types = [i.type.split("{")[0] for b in hlo_stats.computations(hlo).values() for i in b
                 if i.op in ("dot", "convolution")]  # fmt: skip
        return types, hlo_stats.module_stats(hlo).flops

    types, flops = compiled()
    assert "f32[64,16]" in types and not any(t.startswith("f32[64,2,16]") for t in types)
    monkeypatch.setattr(attention, "kv_weights_per_query_head", lambda layer, *a, **k: layer)
    jax.clear_caches()  # the step's traced jaxpr would be reused otherwise
    types_before, flops_before = compiled()
    assert any(t.startswith("f32[64,2,16]") for t in types_before)
    assert flops < flops_before


def test_a_splash_kernel_built_inside_a_trace_caches_no_tracer():
    """The kernel (its mask info arrays) is cached by shape. Built inside the update's
    trace, it held that trace's tracers, and the next jit of the same shapes failed with
    an UnexpectedTracerError (the slow gradient case above, after the forward case); it
    is now built eagerly, so the cached kernel holds arrays. Traced, not compiled."""
    attention._kernel.cache_clear()
    S, n, t, H, K, E = 4, 2, 3, 2, 1, 8
    q = jnp.zeros((1, S + n * t, H, E))
    k = jnp.zeros((1, S + n * t, K, E))
    mask = jnp.ones((1, S), bool)
    run = lambda q, k: attention.grouped_attention(  # noqa: E731
        AttentionBackend.SPLASH, q, k, k, mask, n, t
    )
    jax.jit(run).trace(q, k)
    kernel = attention._kernel(128, S, t, H, True)  # S + n t = 10 positions -> 128
    assert attention._kernel.cache_info().hits == 1
    leaves = jax.tree.leaves(kernel)
    assert leaves and not any(isinstance(x, jax.core.Tracer) for x in leaves)
