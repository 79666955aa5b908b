"""Grouped sampler vs full forward passes, transformers' generate and exact distributions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from scipy import stats

from kjax import sampler_layout, sampling, sharding
from kjax.models import forward, pretrained, save_hf
from kjax.sampler_weights import SamplerWeights
from tests.models.hf_reference import kjax_from_hf, random_hf_model

TENSOR = SamplerWeights.TENSOR

V = 11  # vocabulary of the tiny random model


@pytest.fixture(scope="module")
def hf():
    return random_hf_model(seed=0)


@pytest.fixture(scope="module")
def model(hf):
    return kjax_from_hf(hf)


def _prompts(B=3, S=6, seed=0):
    """Left-padded prompts [B,S] and mask: row 1 has 2 pads, row 2 has one real token."""
    rng = np.random.default_rng(seed)
    mask = np.ones((B, S), bool)
    mask[1, :2] = False
    if B > 2:
        mask[2, : S - 1] = False
    tokens = np.where(mask, rng.integers(0, V, (B, S)), 0).astype(np.int32)
    return tokens, mask


_full = jax.jit(forward, static_argnums=1)


def _full_logits(model, prompts, mask, tokens):
    """Logits [B,N,T,V] predicting each generated token, from one full forward per sample."""
    B, N, T = tokens.shape
    seq = np.concatenate([np.repeat(prompts, N, 0), tokens.reshape(B * N, T)], axis=1)
    seq_mask = np.concatenate([np.repeat(mask, N, 0), np.ones((B * N, T), bool)], axis=1)
    logits = np.asarray(_full(model.params(), model.config, seq, None, seq_mask))
    S = prompts.shape[1]
    return logits[:, S - 1 : S - 1 + T].reshape(B, N, T, -1).astype(np.float64)


def _reference_processed(logits, temperature, top_k=0, top_p=1.0):
    """float64 sort-based log-probs [..., V]: temperature, top-k, then top-p (transformers'
    order); a token is in the nucleus while the mass of tokens sorted before it < top_p."""
    z = logits / temperature
    if top_k:
        z = np.where(z >= np.sort(z, -1)[..., -top_k, None], z, -np.inf)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    desc = -np.sort(-p, -1)
    keep = np.cumsum(desc, -1) - desc < top_p
    threshold = np.where(keep, desc, np.inf).min(-1, keepdims=True)
    p = np.where(p >= threshold, p, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(p / p.sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def greedy(model):
    """Greedy rollouts [3,4,20]: 20 tokens cross from the first decode loop into the second."""
    prompts, mask = _prompts()
    return sampling.sample(model, prompts, mask, key=jax.random.key(0), n=4, max_new_tokens=20,
                           temperature=0.0)  # fmt: skip


@pytest.fixture(scope="module")
def free(model):
    """Rollouts [3,4,10] at temperature 1, no truncation (shared by several tests)."""
    prompts, mask = _prompts()
    return sampling.sample(model, prompts, mask, key=jax.random.key(3), n=4, max_new_tokens=10)


def test_greedy_equals_repeated_argmax_and_transformers_generate(hf, model, greedy):
    prompts, mask = _prompts()
    B, S, T = 3, 6, 20
    tokens = np.asarray(greedy.tokens)
    assert tokens.shape == (B, 4, T) and np.all(greedy.mask) and np.all(greedy.lengths == T)
    assert np.all(tokens == tokens[:, :1])  # greedy: the N samples agree
    np.testing.assert_array_equal(greedy.logprobs, 0.0)
    # Repeated argmax of the full forward over a fixed [B, S+T] buffer (causal attention:
    # the not-yet-generated zeros to the right do not affect position S-1+t).
    seq = np.concatenate([prompts, np.zeros((B, T), np.int32)], axis=1)
    seq_mask = np.concatenate([mask, np.ones((B, T), bool)], axis=1)
    for t in range(T):
        logits = _full(model.params(), model.config, seq, None, seq_mask)
        seq[:, S + t] = np.argmax(logits[:, S - 1 + t], axis=-1)
    np.testing.assert_array_equal(tokens[:, 0], seq[:, S:])
    hf.generation_config.eos_token_id = None  # no early stop: compare all T tokens
    ref = hf.generate(input_ids=torch.tensor(prompts, dtype=torch.long),
                      attention_mask=torch.tensor(mask, dtype=torch.long), do_sample=False,
                      max_new_tokens=T, pad_token_id=0)  # fmt: skip
    np.testing.assert_array_equal(tokens[:, 0], ref[:, S:].numpy())


def test_top_k_1_equals_greedy(model, greedy):
    prompts, mask = _prompts()
    top1 = sampling.sample(model, prompts, mask, key=jax.random.key(1), n=4, max_new_tokens=20,
                           top_k=1)  # fmt: skip
    np.testing.assert_array_equal(top1.tokens, greedy.tokens)
    np.testing.assert_allclose(top1.logprobs, 0.0, atol=1e-6)
    np.testing.assert_allclose(top1.model_logprobs, greedy.model_logprobs, atol=1e-6)


def test_stop_ids_mask_tokens_after_stop_and_set_lengths(model, free):
    prompts, mask = _prompts()
    T = 10
    stop = int(np.asarray(free.tokens)[0, 0, 3])
    out = sampling.sample(model, prompts, mask, key=jax.random.key(3), n=4, max_new_tokens=T,
                          stop_ids=(stop,))  # fmt: skip
    tokens, got = np.asarray(free.tokens), np.asarray(out.tokens)
    hits = tokens == stop
    expected_len = np.where(hits.any(-1), hits.argmax(-1) + 1, T)
    np.testing.assert_array_equal(out.lengths, expected_len)
    assert expected_len.min() < T  # the stop id occurs, so the test means something
    expected_mask = np.arange(T) < expected_len[..., None]
    np.testing.assert_array_equal(out.mask, expected_mask)
    # Same key, same draws up to the stop; nothing after it.
    np.testing.assert_array_equal(got, np.where(expected_mask, tokens, 0))
    for name in ("logprobs", "model_logprobs"):
        np.testing.assert_array_equal(np.asarray(getattr(out, name))[~expected_mask], 0.0)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.7, 0, 0.8),
                                                            (1.3, 4, 0.9)])  # fmt: skip
def test_logprobs_equal_recomputed_full_forward(model, temperature, top_k, top_p):
    prompts, mask = _prompts()
    out = sampling.sample(model, prompts, mask, key=jax.random.key(3), n=4, max_new_tokens=10,
                          temperature=temperature, top_k=top_k, top_p=top_p)  # fmt: skip
    tokens, m = np.asarray(out.tokens), np.asarray(out.mask)
    logits = _full_logits(model, prompts, mask, tokens)
    pick = lambda lp: np.take_along_axis(lp, tokens[..., None], -1)[..., 0]
    raw = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(out.model_logprobs)[m], pick(raw)[m], atol=1e-4)
    processed = pick(_reference_processed(logits, temperature, top_k, top_p))
    assert np.all(np.isfinite(processed[m]))  # every drawn token is inside the support
    np.testing.assert_allclose(np.asarray(out.logprobs)[m], processed[m], atol=1e-4)


def _first_token_counts(model, prompts, mask, n, **kw):
    out = sampling.sample(model, prompts, mask, key=jax.random.key(7), n=n, max_new_tokens=1, **kw)
    tokens = np.asarray(out.tokens)[:, :, 0]
    return np.stack([np.bincount(row, minlength=V) for row in tokens])


def _chi2_pvalue(counts, probs):
    """Pearson chi-square p-value of counts [V] against probs [V] (zero-prob cells must be
    empty: a draw there is impossible, p = 0)."""
    support = probs > 0
    if counts[~support].any():
        return 0.0
    return stats.chisquare(counts[support], counts.sum() * probs[support]).pvalue


def test_first_token_frequencies_match_tempered_and_top_p_distributions(model):
    prompts, mask = _prompts(B=2, seed=5)
    n = 4000
    logits = _full_logits(model, prompts, mask, np.zeros((2, 1, 1), np.int32))[:, 0, 0]
    temp = 0.7
    counts = _first_token_counts(model, prompts, mask, n, temperature=temp)
    for b in range(2):
        probs = np.exp(_reference_processed(logits[b], temp))
        assert _chi2_pvalue(counts[b], probs) > 1e-3
        # The test has power: the untempered distribution is rejected.
        assert _chi2_pvalue(counts[b], np.exp(_reference_processed(logits[b], 1.0))) < 1e-6
    top_p = 0.7
    counts = _first_token_counts(model, prompts, mask, n, temperature=1.0, top_p=top_p)
    for b in range(2):
        probs = np.exp(_reference_processed(logits[b], 1.0, top_p=top_p))
        assert 1 < np.count_nonzero(probs) < V  # a real truncation
        assert _chi2_pvalue(counts[b], probs) > 1e-3
        assert _chi2_pvalue(counts[b], np.exp(_reference_processed(logits[b], 1.0))) < 1e-6


def test_draw_is_the_inverse_cdf():
    """Evenly spaced uniforms hit each token within one draw of M * p, never p = 0."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 700)) * 2
    logits[:, rng.random(700) < 0.5] = -np.inf  # zero-probability tokens, also in whole blocks
    logits[1, 256:512] = -np.inf
    logp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32))
    M = 20000
    u = (np.arange(M) + 0.5) / M
    tokens = jax.vmap(lambda u: sampling.draw(logp, jnp.full((3,), u, jnp.float32)))(u)
    probs = np.exp(np.asarray(logp, np.float64))
    for r in range(3):
        counts = np.bincount(np.asarray(tokens[:, r]), minlength=700)
        assert np.all(np.abs(counts - M * probs[r]) <= 1.01)


@pytest.mark.parametrize("nucleus", ["small", "past_the_candidates"])
def test_processed_logprobs_match_sort_reference(nucleus):
    """Top-p by top-k candidates, and the full-sort fallback when the nucleus is larger."""
    rng = np.random.default_rng(1)
    scale = 3.0 if nucleus == "small" else 0.1  # flat logits: the nucleus spans > 64 tokens
    logits = (rng.normal(size=(4, 300)) * scale).astype(np.float32)
    for top_k, top_p in [(0, 0.9), (20, 0.5), (0, 1.0), (7, 1.0)]:
        got = sampling.processed_logprobs(jnp.asarray(logits), 0.8, top_k, top_p)
        ref = _reference_processed(logits.astype(np.float64), 0.8, top_k, top_p)
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(ref))
        finite = np.isfinite(ref)
        np.testing.assert_allclose(np.asarray(got)[finite], ref[finite], atol=1e-5)
    # The top-p-only case (0, 0.9) picks the path: its nucleus lies inside the candidates
    # in every row, or past them in every row (so the bisection fallback runs).
    size = np.isfinite(_reference_processed(logits.astype(np.float64), 0.8, 0, 0.9)).sum(-1)
    if nucleus == "small":
        assert size.max() <= sampling._NUCLEUS_CANDIDATES
    else:
        assert size.min() > sampling._NUCLEUS_CANDIDATES


def test_same_key_reproduces_and_every_sample_has_its_own_randomness(model):
    prompts, mask = _prompts()
    prompts[2], mask[2] = prompts[0], mask[0]  # a repeated prompt must not repeat its draws
    kw = dict(n=4, max_new_tokens=10)
    a = sampling.sample(model, prompts, mask, key=jax.random.key(11), **kw)
    b = sampling.sample(model, prompts, mask, key=jax.random.key(11), **kw)
    c = sampling.sample(model, prompts, mask, key=jax.random.key(12), **kw)
    jax.tree.map(np.testing.assert_array_equal, a, b)
    assert not np.array_equal(a.tokens, c.tokens)
    tokens = np.asarray(a.tokens)
    for row in tokens:
        assert len({tuple(s) for s in row}) == 4  # distinct samples of each prompt
    assert not np.array_equal(tokens[0], tokens[2])


# (1, 2, 4): tensor 4 cannot split the 2 kv heads, so the K/V cache's rows go over it
# (sharding.cache_spec).
@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), (2, 4, 1), (1, 2, 4)])
def test_sharded_over_eight_devices_equals_single_device(model, mesh_shape):
    prompts, mask = _prompts(B=8, seed=2)
    kw = dict(key=jax.random.key(5), n=4, max_new_tokens=10, top_p=0.9, stop_ids=(3,))
    single = sampling.sample(model, prompts, mask, **kw)
    mesh = sharding.make_mesh(*mesh_shape)
    rows = sharding.batch_sharding(mesh)
    sharded = sampling.sample(sharding.shard(model, mesh), jax.device_put(prompts, rows),
                              jax.device_put(mask, rows), **kw)  # fmt: skip
    assert len(sharded.tokens.sharding.device_set) == 8
    for name in ("tokens", "mask", "lengths"):
        np.testing.assert_array_equal(getattr(sharded, name), getattr(single, name))
    for name in ("logprobs", "model_logprobs"):
        np.testing.assert_allclose(getattr(sharded, name), getattr(single, name), atol=1e-5)


@pytest.mark.slow  # ~4 s on 2 loaded cores; AUTO never picks TENSOR on CPUs
def test_weights_resharded_for_the_sampler_draw_the_same_tokens(model):
    """SamplerWeights.TENSOR (the weights resharded to tensor only inside the jitted
    sampler, traced under the mesh as the trainer traces it) on 8 CPU devices at fsdp 4 x
    tensor 2: the tokens of one device, and no weight left sharded over fsdp."""
    prompts, mask = _prompts(B=8, seed=2)
    kw = dict(n=4, max_new_tokens=10, top_p=0.9, stop_ids=(3,), config=model.config)
    params = model.params()
    single = sampling.sample_params(params, prompts, mask, jax.random.key(5), jnp.float32(1.0),
                                    **kw)  # fmt: skip
    mesh = sharding.make_mesh(1, 4, 2)
    rows = sharding.batch_sharding(mesh)
    sharded = sharding.shard(model, mesh).params()
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        moved = jax.jit(lambda p: sampler_layout.sampler_params(p, model.config, TENSOR))
        assert all("fsdp" not in str(x.sharding.spec) for x in jax.tree.leaves(moved(sharded)))
        out = sampling.sample_params(sharded, jax.device_put(prompts, rows),
                                     jax.device_put(mask, rows), jax.random.key(5),
                                     jnp.float32(1.0), weights=TENSOR, **kw)  # fmt: skip
    for name in ("tokens", "mask", "lengths"):
        np.testing.assert_array_equal(getattr(out, name), getattr(single, name))
    np.testing.assert_allclose(out.logprobs, single.logprobs, atol=1e-5)


def test_one_compilation_across_calls_and_rl_steps(model, monkeypatch):
    traces = []
    prefill = sampling.prefill
    monkeypatch.setattr(sampling, "prefill", lambda *a, **k: traces.append(1) or prefill(*a, **k))
    prompts, mask = _prompts(B=2, S=5, seed=9)  # shapes no other test uses
    params = model.params()
    for step in range(3):
        sampling.sample_params(params, prompts, mask, jax.random.key(step), jnp.float32(0.5 + step),
                               config=model.config, n=3, max_new_tokens=7)  # fmt: skip
        # An RL step: new parameter values, new prompts, same shapes.
        params = jax.tree.map(lambda w: w * 1.01, params)
        prompts = (prompts + 1) % V
    assert len(traces) == 1


def _shapes_in(jaxpr):
    """Every intermediate shape of a jaxpr, sub-jaxprs (scan, while, cond) included."""
    for eqn in jaxpr.eqns:
        yield from (tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
        for p in eqn.params.values():
            for sub in p if isinstance(p, tuple | list) else (p,):
                if hasattr(sub, "eqns") or hasattr(sub, "jaxpr"):
                    yield from _shapes_in(getattr(sub, "jaxpr", sub))


def test_prompt_is_prefilled_once_and_its_kv_stored_once(model):
    c = model.config
    L, K, E, D = c.num_layers, c.num_kv_heads, c.head_dim, c.hidden_size
    B, N, S, T = 2, 3, 7, 5
    prompts, mask = np.ones((B, S), np.int32), np.ones((B, S), bool)
    jaxpr = jax.make_jaxpr(
        lambda p, t, m: sampling.sample_params(
            p, t, m, jax.random.key(0), 1.0, config=c, n=N, max_new_tokens=T
        )  # fmt: skip
    )(model.params(), prompts, mask)
    shapes = set(_shapes_in(jaxpr.jaxpr))
    assert (L, B, S, K, E) in shapes  # prompt K/V: once per prompt
    assert (L, B * N, T - 1, K, E) in shapes  # each sample's own K/V of generated tokens
    assert (B, S, D) in shapes  # prefill runs on B rows ...
    for shape in shapes:  # ... and no K/V-like array of the prompt is made per sample
        if shape[-3:] == (S, K, E):
            assert shape in {(L, B, S, K, E), (B, S, K, E)}, shape
        assert not (B * N in shape and S in shape), shape


def test_decode_windows_cover_each_step_and_stay_within_twice_the_need():
    for T in (1, 2, 3, 17, 18, 19, 64, 100):
        phases = sampling._phases(T)
        assert phases[-1][1] == T and all(
            a[1] < b[1] for a, b in zip(phases, phases[1:], strict=False)
        )
        start = 1
        for window, end in phases:
            assert window <= max(T - 1, 1)  # within the own K/V cache
            for step in range(start, end):
                assert step - 1 <= window <= max(2 * (step - 1), 16)
            start = end


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(n=0), "n"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(temperature=-0.5), "temperature"),
        (dict(stop_ids=(V,)), "stop_ids"),
        (dict(prompts=np.zeros((2, 0), np.int32), prompt_mask=np.zeros((2, 0), bool)), "empty"),
        (dict(prompt_mask=np.array([[True] * 6, [False] * 6])), "empty prompt"),
        (
            dict(prompts=np.zeros((1, 3000), np.int32), prompt_mask=np.ones((1, 3000), bool)),
            "context",
        ),  # fmt: skip
        (dict(max_new_tokens=2045), "max_new_tokens"),
    ],
)
def test_bad_input_raises_a_clear_error(model, kwargs, name):
    args = dict(prompts=np.ones((2, 6), np.int32), prompt_mask=np.ones((2, 6), bool),
                key=jax.random.key(0), n=2, max_new_tokens=4) | kwargs  # fmt: skip
    with pytest.raises(ValueError, match=name):
        sampling.sample(model, **args)


@pytest.mark.slow
def test_smollm2_greedy_equals_transformers_generate(tmp_path):
    """The real SmolLM2-135M-Instruct, two left-padded chat prompts, 24 greedy tokens;
    transformers runs the same weights (save_hf; GGUF parity is tests/models' job)."""
    model, tok = pretrained("smollm2-135m-instruct")
    prompts, mask = tok.chat_batch(
        [[{"role": "user", "content": "Write one sentence about the sea."}],
         [{"role": "user", "content": "What is 2 + 2? Answer briefly, please."}]]
    )  # fmt: skip
    assert not mask.all()  # the batch really is left-padded
    T = 24
    out = sampling.sample(model, prompts, mask, key=jax.random.key(0), n=2, max_new_tokens=T,
                          temperature=0.0)  # fmt: skip
    save_hf(model, str(tmp_path))
    hf = transformers.LlamaForCausalLM.from_pretrained(
        str(tmp_path), attn_implementation="eager", dtype=torch.float32
    ).eval()
    hf.generation_config.eos_token_id = None
    ref = hf.generate(input_ids=torch.tensor(prompts, dtype=torch.long),
                      attention_mask=torch.tensor(mask, dtype=torch.long), do_sample=False,
                      max_new_tokens=T, pad_token_id=tok.pad_id)  # fmt: skip
    ref = ref[:, prompts.shape[1] :].numpy()
    tokens = np.asarray(out.tokens)
    for b in range(2):
        assert tokens[b, 0].tolist() == ref[b].tolist(), (
            tok.decode(tokens[b, 0]),
            tok.decode(ref[b]),
        )
    np.testing.assert_array_equal(tokens[:, 1], tokens[:, 0])
    assert len(set(tokens[0, 0].tolist())) > 5  # a real sentence, not a stuck token
