"""Early-pruning best-of-N decoding against the unpruned grouped sampler with the same key."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from kjax import pruned_sampling, sampling
from kjax.inference import self_certainty
from kjax.models import forward
from kjax.pruned_sampling import Scorer, sample_pruned
from tests.models.hf_reference import kjax_from_hf, random_hf_model

V = 11
N, T = 8, 20  # T = 20 crosses the sampler's first own-K/V window (16) into the second
SCHEDULE = ((5, 4), (17, 2))  # the second decision falls inside the second decode phase


@pytest.fixture(scope="module")
def hf_model():
    return random_hf_model(seed=0)


@pytest.fixture(scope="module")
def model(hf_model):
    return kjax_from_hf(hf_model)


def _prompts(B=3, S=6, seed=0):
    """Left-padded prompts [B,S] and mask: row 1 has 2 pads, row 2 has one real token."""
    rng = np.random.default_rng(seed)
    mask = np.ones((B, S), bool)
    mask[1, :2] = False
    mask[2, : S - 1] = False
    return np.where(mask, rng.integers(0, V, (B, S)), 0).astype(np.int32), mask


def _unpruned(model, key, n=N, max_new_tokens=T, **kw):
    prompts, mask = _prompts()
    return sampling.sample_params(model.params(), jnp.asarray(prompts), jnp.asarray(mask), key,
                                  jnp.float32(kw.pop("temperature", 1.0)), config=model.config,
                                  n=n, max_new_tokens=max_new_tokens, **kw)  # fmt: skip


def _pruned(model, key, n=N, max_new_tokens=T, **kw):
    prompts, mask = _prompts()
    return sample_pruned(model.params(), prompts, mask, key, config=model.config, n=n,
                         max_new_tokens=max_new_tokens, **kw)  # fmt: skip


def _rows(a, candidates):
    """a [B,N,...] at the original candidates [B,m]."""
    a, c = np.asarray(a), np.asarray(candidates)
    return np.take_along_axis(a, c.reshape(c.shape + (1,) * (a.ndim - 2)), 1)


def _assert_rows_equal(got: sampling.Rollouts, ref: sampling.Rollouts, candidates):
    np.testing.assert_array_equal(got.tokens, _rows(ref.tokens, candidates))
    np.testing.assert_array_equal(got.mask, _rows(ref.mask, candidates))
    np.testing.assert_array_equal(got.lengths, _rows(ref.lengths, candidates))
    for name in ("logprobs", "model_logprobs"):
        np.testing.assert_allclose(getattr(got, name), _rows(getattr(ref, name), candidates),
                                   atol=1e-5)  # fmt: skip


_SLOW = pytest.mark.slow  # the other two corners of the 2 x 2 grid; each axis is covered


@pytest.mark.parametrize(
    ("schedule", "temperature", "top_k", "top_p"),
    [
        ((), 1.0, 0, 1.0),
        (((5, N), (17, N)), 0.8, 5, 0.9),
        pytest.param((), 0.8, 5, 0.9, marks=_SLOW),
        pytest.param(((5, N), (17, N)), 1.0, 0, 1.0, marks=_SLOW),
    ],
)
def test_no_pruning_equals_sample_params(model, schedule, temperature, top_k, top_p):
    key = jax.random.key(3)
    ref = _unpruned(model, key, temperature=temperature, top_k=top_k, top_p=top_p)
    got = _pruned(model, key, temperature=temperature, top_k=top_k, top_p=top_p,
                  schedule=schedule)  # fmt: skip
    np.testing.assert_array_equal(got.candidates, np.broadcast_to(np.arange(N), (3, N)))
    _assert_rows_equal(got.rollouts, ref, got.candidates)
    np.testing.assert_array_equal(got.decoded_tokens, np.asarray(ref.lengths).sum(-1))


@pytest.mark.parametrize("scorer", list(Scorer))
def test_survivors_equal_the_unpruned_rows(model, scorer):
    key = jax.random.key(5)
    ref = _unpruned(model, key, temperature=0.9)
    got = _pruned(model, key, temperature=0.9, schedule=SCHEDULE, scorer=scorer)
    assert got.rollouts.tokens.shape == (3, 2, T) and got.candidates.shape == (3, 2)
    c = np.asarray(got.candidates)
    assert np.all(np.diff(c, axis=-1) > 0) and c.min() >= 0 and c.max() < N
    _assert_rows_equal(got.rollouts, ref, got.candidates)


def _assert_top(scores, alive, kept, keep):
    """kept [B,keep] are the top-`keep` of scores [B,N] among alive [B,m] candidates (ties
    within 1e-5 may go either way; a clear boundary must match the stable order exactly)."""
    for b in range(scores.shape[0]):
        s = scores[b, alive[b]]
        is_kept = np.isin(alive[b], kept[b])
        assert is_kept.sum() == keep
        assert s[is_kept].min() >= s[~is_kept].max() - 1e-5 if (~is_kept).any() else True
        order = alive[b][np.argsort(-s, kind="stable")]
        if (~is_kept).any() and np.sort(-s)[keep] - np.sort(-s)[keep - 1] > 1e-5:
            np.testing.assert_array_equal(np.sort(order[:keep]), kept[b])


def _mean_logprob(ref, step):
    m = np.asarray(ref.mask)[..., :step]
    lp = np.asarray(ref.model_logprobs, np.float64)[..., :step]
    return (lp * m).sum(-1) / np.maximum(m.sum(-1), 1)


def _self_certainty(model, ref, step):
    """kjax.inference.self_certainty of the first `step` tokens, from full forward logits."""
    prompts, mask = _prompts()
    B, n, _ = ref.tokens.shape
    tokens = np.asarray(ref.tokens)[..., :step]
    seq = np.concatenate([np.repeat(prompts, n, 0), tokens.reshape(B * n, step)], axis=1)
    seq_mask = np.concatenate([np.repeat(mask, n, 0), np.ones((B * n, step), bool)], axis=1)
    logits = np.asarray(forward(model.params(), model.config, seq, None, seq_mask))
    S = prompts.shape[1]
    logits = logits[:, S - 1 : S - 1 + step].reshape(B, n, step, -1)
    return np.asarray(self_certainty(logits, np.asarray(ref.mask)[..., :step]), np.float64)


@pytest.mark.parametrize("scorer", [Scorer.MEAN_LOGPROB, Scorer.SELF_CERTAINTY])
def test_kept_candidates_are_the_top_by_score(model, scorer):
    key = jax.random.key(11)
    ref = _unpruned(model, key)
    score = _mean_logprob if scorer is Scorer.MEAN_LOGPROB else (
        lambda ref, step: _self_certainty(model, ref, step))  # fmt: skip
    alive = np.broadcast_to(np.arange(N), (3, N))
    for i, (step, keep) in enumerate(SCHEDULE):
        got = _pruned(model, key, schedule=SCHEDULE[: i + 1], scorer=scorer)
        kept = np.asarray(got.candidates)
        _assert_top(score(ref, step), alive, kept, keep)
        alive = kept


def test_compute_accounting_by_hand(model):
    """Stops forced by a frequent stop id; pruned candidates count tokens up to pruning."""
    key = jax.random.key(2)
    free = np.asarray(_unpruned(model, key, max_new_tokens=10).tokens)
    stop = int(np.bincount(free.ravel(), minlength=V).argmax())
    schedule = ((3, 4), (6, 2))
    ref = _unpruned(model, key, max_new_tokens=10, stop_ids=(stop,))
    got = _pruned(model, key, max_new_tokens=10, stop_ids=(stop,), schedule=schedule)
    lengths = np.asarray(ref.lengths)
    assert (lengths < 3).any() and (lengths < 10).sum() > 3  # stops before and after decisions
    # Which candidate left when: replay the decisions with the unpruned run's scores.
    prompts, mask = _prompts()
    S_real = mask.sum(-1)
    c = model.config
    D, F, H, K, E, L = (c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads,
                        c.head_dim, c.num_layers)  # fmt: skip
    assert (D, F, H, K, E, L, c.vocab_size) == (16, 24, 4, 2, 4, 2, V)
    # Per layer: q (16x16) + o (16x16) + k, v (16x8 each) + gate, up, down (16x24 each).
    per_pass = 2 * (2 * (256 + 256 + 128 + 128 + 3 * 384) + 16 * 11)  # = 8032
    per_key = 4 * 2 * 4 * 4  # scores and values: 2 matmuls x 2 flops x L x H x E = 128
    assert pruned_sampling.decode_flops(c, 0) == per_pass == 8032
    assert pruned_sampling.decode_flops(c, 1) - per_pass == per_key
    scores_ref = {d: _mean_logprob(ref, d) for d, _ in schedule}
    expected_tokens, expected_flops = [], []
    for b in range(3):
        alive, leave_len = list(range(N)), {}
        for d, keep in schedule:
            s = scores_ref[d][b, alive]
            top = sorted(np.array(alive)[np.argsort(-s, kind="stable")[:keep]].tolist())
            for j in set(alive) - set(top):
                leave_len[j] = min(lengths[b, j], d)
            alive = top
        np.testing.assert_array_equal(np.asarray(got.candidates)[b], alive)
        for j in alive:
            leave_len[j] = lengths[b, j]
        assert len(leave_len) == N
        expected_tokens.append(sum(leave_len.values()))
        # Prefill: 6 - pads real tokens, one unembedding; decode: token i >= 1 of a candidate
        # is one pass over S_real + i keys.
        s = int(S_real[b])
        flops = 2 * L * (256 + 256 + 128 + 128 + 3 * 384) * s + 2 * 16 * 11
        flops += per_key * s * (s + 1) // 2
        for length in leave_len.values():
            flops += sum(per_pass + per_key * (s + i) for i in range(1, int(length)))
        expected_flops.append(flops)
    np.testing.assert_array_equal(got.decoded_tokens, expected_tokens)
    np.testing.assert_allclose(got.flops, expected_flops, rtol=1e-12)
    # Saving against the unpruned run of the same candidates.
    assert (got.decoded_tokens < lengths.sum(-1)).all()


def test_hand_count_without_stops(model):
    """No stops: n=4, T=5, keep 2 after 2 tokens, 1 after 3: 2*2 + 1*3 + 1*5 = 12 tokens."""
    got = _pruned(model, jax.random.key(0), n=4, max_new_tokens=5, schedule=((2, 2), (3, 1)))
    np.testing.assert_array_equal(got.decoded_tokens, [12, 12, 12])
    assert got.rollouts.tokens.shape == (3, 1, 5) and np.all(got.rollouts.lengths == 5)


def test_host_scorer_is_called_between_stages(model):
    calls = []

    def prefer_low_index(partial, candidates, step):
        calls.append((step, partial.tokens.shape, candidates.copy()))
        assert np.all(np.asarray(partial.mask)[..., :step]) and not np.any(
            np.asarray(partial.mask)[..., step:])  # fmt: skip
        return -candidates.astype(np.float32)

    key = jax.random.key(4)
    got = _pruned(model, key, schedule=SCHEDULE, scorer=prefer_low_index)
    assert [(s, shape) for s, shape, _ in calls] == [(5, (3, N, T)), (17, (3, 4, T))]
    np.testing.assert_array_equal(calls[1][2], np.broadcast_to(np.arange(4), (3, 4)))
    np.testing.assert_array_equal(got.candidates, np.broadcast_to(np.arange(2), (3, 2)))
    _assert_rows_equal(got.rollouts, _unpruned(model, key), got.candidates)


def test_greedy(model):
    got = _pruned(model, jax.random.key(0), greedy=True, schedule=SCHEDULE)
    ref = _unpruned(model, jax.random.key(0), greedy=True)
    _assert_rows_equal(got.rollouts, ref, got.candidates)


@pytest.mark.parametrize(
    ("schedule", "match"),
    [
        (((4, N + 1),), "keep=9 must be in"),
        (((4, 4), (8, 6)), "keep may never grow"),
        (((4, 0),), "keep=0 must be in"),
        (((8, 4), (8, 2)), "strictly increasing"),
        (((8, 4), (6, 2)), "strictly increasing"),
        (((0, 4),), "strictly increasing and >= 1"),
        (((T, 4),), "must be < max_new_tokens"),
        (((T + 3, 4),), "must be < max_new_tokens"),
        ((4, 2), "pairs"),
        ((("a", 2),), "pairs"),
    ],
)
def test_bad_schedule_raises(model, schedule, match):
    with pytest.raises(ValueError, match=match):
        _pruned(model, jax.random.key(0), schedule=schedule)


def test_bad_host_scorer_shape_raises(model):
    with pytest.raises(ValueError, match="host scorer returned shape"):
        _pruned(model, jax.random.key(0), schedule=SCHEDULE,
                scorer=lambda partial, c, step: np.zeros((3,)))  # fmt: skip


# ----------------------------------------------------------------------------- ST-BoN


def _hf_hidden(hf_model, ref, steps):
    """transformers' hidden states [B,n,steps,L+1,D] float64 of the passes that drew tokens
    0..steps-1 (the last prompt position, then each fed token), from one full forward."""
    prompts, mask = _prompts()
    B, n, _ = ref.tokens.shape
    tokens = np.asarray(ref.tokens)[..., : steps - 1].reshape(B * n, steps - 1)
    seq = np.concatenate([np.repeat(prompts, n, 0), tokens], axis=1)
    seq_mask = np.concatenate([np.repeat(mask, n, 0), np.ones_like(tokens, bool)], axis=1)
    positions = np.maximum(np.cumsum(seq_mask, axis=-1) - 1, 0)
    with torch.no_grad():
        out = hf_model(input_ids=torch.tensor(seq), attention_mask=torch.tensor(seq_mask),
                       position_ids=torch.tensor(positions), output_hidden_states=True)  # fmt: skip
    hidden = np.stack([h.double().numpy() for h in out.hidden_states], axis=2)  # [Bn,S',L+1,D]
    S = prompts.shape[1]
    return hidden[:, S - 1 :].reshape(B, n, steps, *hidden.shape[2:])


def _coe_reference(hs):
    """The authors' CoECalculator on hs [L+1,N,D] in float64: features [N] -> scores [N]."""
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-8)
    angle = lambda a, b: np.arccos(np.clip((unit(a) * unit(b)).sum(-1), -1 + 1e-7, 1 - 1e-7))
    h0, hL = hs[0], hs[-1]
    M = np.linalg.norm(hs[:-1] - hs[1:], axis=-1) / np.linalg.norm(h0 - hL, axis=-1)
    A = angle(hs[:-1], hs[1:]) / angle(h0, hL)
    F = (M - A).mean(0)
    return ((F[:, None] - F[None, :]) ** 2).sum(1) / (len(F) - 1)


def _st_bon_votes(hidden, tokens, decision):
    """ST-BoN's votes [n] for one prompt, the authors' stages 1-2 with tau = c, truncated
    at the decision step: hidden [n,decision,L+1,D], tokens [n,>=decision] (no stops)."""
    n = tokens.shape[0]
    prefixes = [{tuple(r) for r in tokens[:, :g].tolist()} for g in range(1, decision + 1)]
    distinct = [len(p) == n for p in prefixes]
    votes = np.zeros(n, int)
    if any(distinct):
        c = 1 + distinct.index(True)
        for end in range(c + 1, min(2 * c, decision) + 1):
            votes[np.argmin(_coe_reference(hidden[:, :end].mean(1).transpose(1, 0, 2)))] += 1
    if votes.sum() == 0:
        votes[np.argmin(_coe_reference(hidden.mean(1).transpose(1, 0, 2)))] += 1
    return votes


def test_coe_features_of_a_straight_trajectory():
    """h_l = (l + 1) u: each step is 1/L of the way and no turn, so F = 1/L - 1."""
    L, u = 4, np.array([0.3, -1.0, 2.0], np.float32)
    hidden = np.arange(1, L + 2, dtype=np.float32)[:, None] * u
    got = pruned_sampling.coe_features(jnp.asarray(hidden))
    np.testing.assert_allclose(got, 1 / L - 1, rtol=1e-6)
    features = jnp.asarray([[0.0, 1.0, 3.0]])
    np.testing.assert_allclose(pruned_sampling.coe_dispersion(features), [[5.0, 2.5, 6.5]])


@pytest.mark.parametrize("keep", [1, 3])
def test_st_bon_keeps_the_most_voted_by_hf_hidden_states(model, hf_model, keep):
    """Against the authors' rule on transformers' hidden states: c, the (c, 2c] window, the
    per-step CoE consistency vote, ties to the lowest index."""
    key, decision = jax.random.key(7), 12
    ref = _unpruned(model, key, temperature=1.2)
    got = _pruned(model, key, temperature=1.2, schedule=((decision, keep),),
                  scorer=Scorer.ST_BON)  # fmt: skip
    hidden = _hf_hidden(hf_model, ref, decision)
    tokens = np.asarray(ref.tokens)
    for b in range(3):
        votes = _st_bon_votes(hidden[b], tokens[b], decision)
        expected = np.sort(np.argsort(-votes, kind="stable")[:keep])
        np.testing.assert_array_equal(np.asarray(got.candidates)[b], expected)
    _assert_rows_equal(got.rollouts, ref, got.candidates)
