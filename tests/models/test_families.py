"""Qwen2, Qwen3 and Mistral (config fields of kjax's one decoder core) against transformers'
PyTorch models on tiny random configs, each family with its features switched on: logits,
KV-cache decode, the grouped sampler's greedy text and gradients, at Llama's tolerances."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.sharding import PartitionSpec as P

from kjax import sampling, sharding
from kjax.models import Family, LlamaConfig, decode_step, forward, from_params, prefill
from kjax.models.weights import hf_to_params
from tests.models.hf_reference import hf_logits, kjax_from_hf, random_family_model

# name -> (model_type, transformers config overrides). Every case has GQA (K=2 < H=4 by
# default) and a sliding window shorter than the sequences below where the family has one.
CASES = {
    # q/k/v biases; window 5 on layer 1 only (max_window_layers=1); head_dim 6 != 16/4
    "qwen2": (
        "qwen2",
        dict(use_sliding_window=True, sliding_window=5, max_window_layers=1, head_dim=6),
    ),
    # tied embeddings, MQA, no window (use_sliding_window false, as Qwen2.5 ships)
    "qwen2_tied": ("qwen2", dict(tie_word_embeddings=True, num_key_value_heads=1)),
    # per-head q/k RMSNorm; head_dim 6; window 4 on layer 1
    "qwen3": (
        "qwen3",
        dict(head_dim=6, use_sliding_window=True, sliding_window=4, max_window_layers=1),
    ),
    # window 4 on every layer; head_dim 6
    "mistral": ("mistral", dict(sliding_window=4, head_dim=6)),
}
WINDOWED = ("qwen2", "qwen3", "mistral")


def _case(name, seed=0, **extra):
    family, overrides = CASES[name]
    return random_family_model(family, seed=seed, **(overrides | extra))


def _tokens(rng, B, S, V=11):
    return rng.integers(0, V, size=(B, S)).astype(np.int32)


_forward = jax.jit(forward, static_argnums=1)


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_match_transformers_with_left_padding(name):
    hf = _case(name, seed=1)
    model = kjax_from_hf(hf)
    assert model.config.family is Family(CASES[name][0])
    rng = np.random.default_rng(0)
    tokens = _tokens(rng, 3, 14)
    mask = np.ones_like(tokens)
    mask[1, :4] = 0
    mask[2, :12] = 0
    tokens = np.where(mask == 1, tokens, 0)
    ours = np.asarray(_forward(model.params(), model.config, tokens, None, mask))
    ref = hf_logits(hf, tokens, mask)
    real = mask.astype(bool)
    assert np.abs(ref).max() > 1.0  # logits large enough for 1e-5 to be a real test
    np.testing.assert_allclose(ours[real], ref[real], atol=1e-5, rtol=0)
    if name in WINDOWED:  # the window changes the logits: the test sees it
        full = dataclasses.replace(model.config, sliding_window=None, sliding_layers=())
        unwindowed = np.asarray(_forward(model.params(), full, tokens, None, mask))
        assert np.abs(unwindowed[real] - ref[real]).max() > 1e-2


@pytest.mark.parametrize(
    # the decode path is the same code for every family; the sampler test covers each
    "name",
    ["qwen3", *(pytest.param(n, marks=pytest.mark.slow) for n in ("qwen2", "mistral"))],
)
def test_kv_cache_decode_equals_full_forward(name):
    model = kjax_from_hf(_case(name, seed=2))
    params, config = model.params(), model.config
    rng = np.random.default_rng(2)
    B, S, T = 2, 5, 7  # 12 positions, windows 4-5
    tokens = _tokens(rng, B, S + T)
    mask = np.ones_like(tokens)
    mask[0, :2] = 0  # left padding in the prompt of row 0
    full = np.asarray(_forward(params, config, tokens, None, mask))
    logits, cache = jax.jit(prefill, static_argnums=(1, 4))(
        params, config, tokens[:, :S], mask[:, :S], S + T
    )
    np.testing.assert_allclose(logits[1], full[1, :S], atol=1e-5, rtol=0)
    step = jax.jit(decode_step, static_argnums=1)
    for t in range(S, S + T):
        next_logits, cache = step(params, config, jnp.asarray(tokens[:, t]), cache)
        np.testing.assert_allclose(next_logits, full[:, t], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", WINDOWED)
def test_grouped_greedy_sampler_equals_transformers_generate(name):
    hf = _case(name, seed=3)
    model = kjax_from_hf(hf)
    rng = np.random.default_rng(3)
    B, S, T = 3, 6, 18  # 24 positions: the window slides over prompt and own tokens
    mask = np.ones((B, S), bool)
    mask[1, :2] = False
    mask[2, : S - 1] = False
    prompts = np.where(mask, _tokens(rng, B, S), 0).astype(np.int32)
    out = sampling.sample(
        model, prompts, mask, key=jax.random.key(0), n=2, max_new_tokens=T, temperature=0.0
    )
    tokens = np.asarray(out.tokens)
    assert np.all(tokens == tokens[:, :1])  # greedy: the N samples agree
    hf.generation_config.eos_token_id = None  # no early stop: compare all T tokens
    ref = hf.generate(
        input_ids=torch.tensor(prompts, dtype=torch.long),
        attention_mask=torch.tensor(mask, dtype=torch.long),
        do_sample=False,
        max_new_tokens=T,
        pad_token_id=0,
    )
    np.testing.assert_array_equal(tokens[:, 0], ref[:, S:].numpy())
    assert len(np.unique(tokens[:, 0])) > 2  # not a constant continuation


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_biases_and_qk_norms_shard_by_the_rules_and_match_one_device(name):
    model = kjax_from_hf(_case(name, seed=4))
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    host = jax.device_get(model.params())
    sharded = from_params(model.config, host, mesh=mesh)
    specs = {k: v.sharding.spec for k, v in sharded.params()["layers"].items()}
    if name == "qwen2":  # biases shard their heads over "tensor", as the projections do
        assert specs["q_bias"] == P(None, "tensor", None) == specs["k_bias"]
        assert specs["q"] == P(None, "fsdp", "tensor", None)
    else:  # the [E] norm weights are replicated
        assert specs["q_norm"] == P(None, None) == specs["k_norm"]
    tokens = _tokens(np.random.default_rng(4), 8, 10)
    batch = sharding.batch_sharding(mesh)
    run = jax.jit(lambda m, t: m(t))
    np.testing.assert_allclose(
        run(sharded, jax.device_put(tokens, batch)), run(model, tokens), atol=1e-5, rtol=0
    )


def _nll(logits, tokens, mask):
    """Mean next-token NLL over real (mask=1) target positions."""
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    w = mask[:, 1:].astype(jnp.float32)
    return -jnp.sum(picked * w) / jnp.sum(w)


@pytest.mark.parametrize(
    "name", ["qwen2", "qwen3", "mistral", pytest.param("qwen2_tied", marks=pytest.mark.slow)]
)
def test_gradients_match_transformers(name):
    """Every parameter's gradient (biases and q/k norms included) against PyTorch's
    autograd of the same token log-likelihood, left-padded rows and windows included."""
    hf = _case(name, seed=8)
    rng = np.random.default_rng(9)
    tokens = _tokens(rng, 3, 9)
    mask = np.ones_like(tokens)
    mask[1, :3] = 0
    positions = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
    model = kjax_from_hf(hf)

    def loss(p):
        return _nll(forward(p, model.config, tokens, attention_mask=mask), tokens, mask)

    grads = jax.jit(jax.grad(loss))(model.params())
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
    torch_grads = {k: p.grad.detach().numpy() for k, p in hf.named_parameters()}
    if model.config.tie_embeddings:  # one tensor in torch: its grad holds both uses
        torch_grads.pop("lm_head.weight", None)
    ref = dict(jax.tree.leaves_with_path(hf_to_params(torch_grads, model.config)))
    names = set()
    for path, g in jax.tree.leaves_with_path(grads):
        r = np.asarray(ref[path])
        scale = float(np.abs(r).max())
        assert scale > 1e-4, path  # every parameter gets a gradient
        np.testing.assert_allclose(np.asarray(g), r, atol=2e-5 * scale, err_msg=str(path))
        names.add(jax.tree_util.keystr(path))
    family = CASES[name][0]
    assert ("['layers']['q_bias']" in names) == (family == "qwen2")
    assert ("['layers']['k_norm']" in names) == (family == "qwen3")


# ----------------------------------------------------------------------------- config.json


def _hf_json(name, **edits):
    return json.loads(_case(name).config.to_json_string()) | edits


def test_family_fields_round_trip_through_config_json():
    for name in CASES:
        config = LlamaConfig.from_hf(_hf_json(name))
        assert LlamaConfig.from_hf(config.to_hf()) == config
    qwen2 = LlamaConfig.from_hf(_hf_json("qwen2"))
    assert qwen2.qkv_bias and qwen2.window_layers == (False, True) and qwen2.head_dim == 6
    # Qwen2.5 ships use_sliding_window=false with a sliding_window number: no window.
    off = LlamaConfig.from_hf(_hf_json("qwen2", use_sliding_window=False))
    assert off.sliding_window is None and off.window_layers == (False, False)
    # Without layer_types (transformers v4 files), max_window_layers decides.
    v4 = _hf_json("qwen3", max_window_layers=0)
    del v4["layer_types"]
    assert LlamaConfig.from_hf(v4).window_layers == (True, True)
    assert LlamaConfig.from_hf(_hf_json("mistral", sliding_window=None)).sliding_window is None


@pytest.mark.parametrize(
    "name,edits,message",
    [
        (
            "qwen3",
            {"model_type": "gemma3"},
            "model_type='gemma3'.*families llama, qwen2, qwen3, mistral",
        ),
        ("qwen3", {"attention_bias": True}, "'attention_bias'=True is not supported.*Qwen3"),
        ("qwen2", {"use_mrope": True}, "'use_mrope'=True is not supported"),
        (
            "mistral",
            {"use_sliding_window": True},
            "'use_sliding_window'.*Mistral does not implement it.*families with it: qwen2, qwen3",
        ),
        (
            "qwen2",
            {"attn_logit_softcapping": 30.0},
            "'attn_logit_softcapping'.*no family kjax implements has it",
        ),
        (
            "qwen3",
            {"layer_types": ["full_attention", "chunked_attention"]},
            "layer_types must list.*unsupported \\['chunked_attention'\\]",
        ),
    ],
)
def test_unsupported_architecture_or_field_is_named(name, edits, message):
    with pytest.raises(ValueError, match=message):
        LlamaConfig.from_hf(_hf_json(name, **edits))


def test_a_family_feature_outside_its_family_is_refused():
    base = dict(
        vocab_size=11, hidden_size=16, intermediate_size=24, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=4,
    )  # fmt: skip
    with pytest.raises(ValueError, match="sliding window is not part of family llama"):
        LlamaConfig(**base, sliding_window=4)
    with pytest.raises(ValueError, match="Mistral's window covers every layer"):
        LlamaConfig(**base, family=Family.MISTRAL, sliding_window=4, sliding_layers=(1, 0))
    qwen2 = LlamaConfig(**base, family="qwen2", sliding_window=4, sliding_layers=(0, 1))
    assert qwen2.qkv_bias and not qwen2.qk_norm and qwen2.window_layers == (0, 1)
    mistral = LlamaConfig(**base, family=Family.MISTRAL, sliding_window=4)
    assert mistral.window_layers == (True, True) and not mistral.qkv_bias


# The published config.json of the presets' models (experiments/configs/qwen25_math_7b.py,
# qwen3_8b_math.py) and of Mistral-7B-v0.1: every field they carry is read or refused.
PUBLISHED = {
    "Qwen2.5-Math-7B": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu",
        "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944,
        "max_position_embeddings": 4096, "max_window_layers": 28, "model_type": "qwen2",
        "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06, "rope_theta": 10000, "sliding_window": 4096,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.37.0", "use_cache": True, "use_mrope": False,
        "use_sliding_window": False, "vocab_size": 152064,
    },
    "Qwen3-8B": {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 12288,
        "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
        "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "Mistral-7B-v0.1": {
        "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 14336, "max_position_embeddings": 32768,
        "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
        "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000,
    },
}  # fmt: skip


def test_published_config_files_parse_to_their_families():
    qwen25 = LlamaConfig.from_hf(PUBLISHED["Qwen2.5-Math-7B"])
    assert qwen25.family is Family.QWEN2 and qwen25.qkv_bias and qwen25.sliding_window is None
    assert (qwen25.head_dim, qwen25.num_kv_heads, qwen25.rope_theta) == (128, 4, 10000.0)
    qwen3 = LlamaConfig.from_hf(PUBLISHED["Qwen3-8B"])
    assert qwen3.family is Family.QWEN3 and qwen3.qk_norm and qwen3.head_dim == 128
    assert qwen3.eos_ids == (151645,) and qwen3.sliding_window is None
    mistral = LlamaConfig.from_hf(PUBLISHED["Mistral-7B-v0.1"])
    assert mistral.sliding_window == 4096 and all(mistral.window_layers)
