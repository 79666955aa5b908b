"""Early-pruning best-of-N decoding: start N candidates per prompt, drop the worst at fixed steps.

Speculative rejection (Sun et al., NeurIPS 2024) and Self-Truncation Best-of-N (2025) both
decode many candidates for a few tokens, score the partial candidates, and finish only the
best. `sample_pruned` does this on kjax's grouped sampler (`kjax.sampling`): each prompt is
prefilled once and its K/V shared by all its candidates for the whole run; at each decision
step of a static `schedule` the partial candidates are scored and the best `keep` of each
prompt survive, with their own K/V caches, tokens, masks and log-probs gathered into a
smaller batch. Each stage (the steps between two decisions) is one jitted call with static
shapes, so it compiles once per (candidates, steps) pair and is reused across calls.

Randomness. `kjax.sampling.sample_params` draws the token of step t of every sample from
one uniform vector `uniform(fold_in(key, t), (B*N,))`, row b*N + j for candidate j of prompt
b. Pruned sampling draws that same full vector at every step (B*N uniforms: negligible next
to a model pass) and gives each survivor the entry of its original index. So a survivor's
tokens and log-probs are exactly those the unpruned sampler (same key, same n) gives that
candidate, and a schedule that prunes nothing reproduces `sample_params` token for token.

Scorers (higher is better; ties go to the lower original candidate index):
  - Scorer.MEAN_LOGPROB: mean over the tokens so far of the raw model's log-prob
    (temperature 1, the `model_logprobs` field), i.e. the policy's own confidence.
  - Scorer.SELF_CERTAINTY: mean over the tokens so far of KL(Uniform_V || softmax(logits))
    of the raw model's next-token distribution (Kang et al. 2025; the per-token quantity of
    `kjax.inference.self_certainty`, accumulated during decoding so no logits are kept).
  - Scorer.ST_BON: Self-Truncation Best-of-N's rule (Wang et al., "Sampling-Efficient
    Test-Time Scaling: Self-Estimating the Best-of-N Sampling in Early Decoding", NeurIPS
    2025, arXiv 2503.01422) as its authors' code computes it (github.com/Alsace08/ST-BoN,
    decoders.py; only the paper's abstract could be read here). The earliest estimation
    time c is the first completion length at which the n prefixes of a prompt are pairwise
    distinct (or one has stopped). At each length t in (c, c + tau], tau = c, every
    candidate's hidden-state trajectory (embedding and each layer's output, the last one
    final-normed, averaged over the candidate's forward passes so far, the shared
    prefill's included) gives a Chain-of-Embedding feature F (`coe_features`); the
    candidate with the least mean squared gap (F_i - F_j)^2 to the others
    (`coe_dispersion`) gets one vote. The score is the vote count (ties: lower index, as
    the authors' winner rule). kjax's stages are static, so the decision step comes from
    the schedule, not from c + tau: votes past it are not cast, a prompt with no vote by
    then gets one at the decision step, and a decision later than c + tau pays for
    candidates the authors' code would already have truncated. Also unlike their code, a
    candidate stops accumulating hidden states when it stops (transformers keeps feeding
    it padding). The feature work (O(n L D) per step) is not counted in `flops`.
  - any host callable `scorer(partial: Rollouts, candidates, step) -> [B, n] scores`
    (e.g. a reward model on the detokenized partial text): stages are separate jitted
    calls, so it runs on the host between them.
A candidate that already stopped before a decision step is scored like the others (its
score covers all its tokens) and may be pruned.

Compute accounting (per prompt, numpy, exact integers then float64):
  - decoded_tokens: sum over candidates of the tokens each generated before it stopped or
    was pruned (its mask count when it left the batch).
  - flops: model FLOPs, `prefill_flops` for the prompt (once, shared) plus, for every
    generated token after the first, one decode pass feeding the previous token
    (`decode_flops(config, context)`, the formula of `experiments/bench/bench_sampler.py`:
    2 x matmul parameters, unembedding included, + 4 L H E x context for attention scores and
    values), with context = the prompt's real tokens + the position in the completion. The
    first token of each candidate comes from the shared prefill logits and costs no pass.
    These are model FLOPs of the work that matters, not hardware FLOPs: the static-shape
    loops also run rows of candidates that stopped early and attend over prompt padding.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kjax import sampling
from kjax.models.config import LlamaConfig
from kjax.sampler_weights import SamplerWeights
from kjax.sampling import PromptCache, Rollouts


class Scorer(enum.Enum):
    """On-device scorers of partial candidates (see the module docstring)."""

    MEAN_LOGPROB = "mean_logprob"
    SELF_CERTAINTY = "self_certainty"
    ST_BON = "st_bon"


HostScorer = Callable[[Rollouts, np.ndarray, int], "np.ndarray | jax.Array"]


class PrunedRollouts(NamedTuple):
    """Survivors of pruned best-of-N decoding, plus what it cost.

    rollouts: Rollouts with [B, keep, T] arrays (keep = the schedule's last keep, or n),
      survivors in increasing original-candidate order.
    candidates: [B, keep] int32, each survivor's original candidate index in [0, n).
    decoded_tokens: [B] int64 numpy, tokens generated per prompt over all n candidates
      (pruned ones up to their pruning).
    flops: [B] float64 numpy, model FLOPs per prompt (prefill once + decode passes).
    """

    rollouts: Rollouts
    candidates: jax.Array
    decoded_tokens: np.ndarray
    flops: np.ndarray


class _StBon(NamedTuple):
    """ST-BoN's running state (Scorer.ST_BON in the module docstring): hidden [B,n,L+1,D]
    float32, the sum of each candidate's hidden states over its forward passes; passes
    [B,n] int32, their count; same [B,n,n] bool, prefixes i and j equal so far; diverged
    [B] int32, the earliest estimation time c (0: not yet); votes [B,n] int32."""

    hidden: jax.Array
    passes: jax.Array
    same: jax.Array
    diverged: jax.Array
    votes: jax.Array


class _State(NamedTuple):
    """Carry of the decode loops: step (index of the token drawn next), done [B,n],
    own_k/own_v [L,B*n,C,K,E], out (Rollouts buffers [B,n,T]), certainty [B,n] (sum of
    the per-token self-certainty of the recorded tokens), candidates [B,n] int32 (original
    indices, which pick each row's uniforms), st (_StBon, or None unless the scorer is
    Scorer.ST_BON: hidden states cost a [B,n,L+1,D] carry and a feature pass per step)."""

    step: jax.Array
    done: jax.Array
    own_k: jax.Array
    own_v: jax.Array
    out: Rollouts
    certainty: jax.Array
    candidates: jax.Array
    st: _StBon | None


# ----------------------------------------------------------------------------- FLOPs


def decode_flops(config: LlamaConfig, context: int | np.ndarray):
    """Forward FLOPs of one decode pass (one new token) attending over `context` keys:
    weight matmuls (unembedding included) + attention scores and values."""
    c = config
    D, F, H, K, E = c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim
    per_layer = D * H * E * 2 + D * K * E * 2 + 3 * D * F
    matmuls = 2.0 * (c.num_layers * per_layer + D * c.vocab_size)
    return matmuls + 4.0 * c.num_layers * H * E * np.asarray(context, np.float64)


def prefill_flops(config: LlamaConfig, prompt_len: int | np.ndarray):
    """Forward FLOPs of a prefill of `prompt_len` real tokens (causal attention; only the
    last position is unembedded)."""
    c = config
    D, F, H, K, E = c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim
    s = np.asarray(prompt_len, np.float64)
    per_layer = D * H * E * 2 + D * K * E * 2 + 3 * D * F
    pairs = s * (s + 1) / 2  # (query, key) pairs of a causal square
    attention = 4.0 * c.num_layers * H * E * pairs
    return 2.0 * c.num_layers * per_layer * s + 2.0 * D * c.vocab_size + attention


def _account(config: LlamaConfig, lengths: np.ndarray, prompt_len: np.ndarray):
    """(tokens [B], decode FLOPs [B]) of candidates that generated `lengths` [B,m] tokens:
    token i >= 1 costs one pass over prompt_len + i keys."""
    lengths = lengths.astype(np.int64)
    passes = np.maximum(lengths - 1, 0)
    context = passes * prompt_len[:, None] + passes * (passes + 1) // 2
    per_pass = decode_flops(config, 0)
    attention = decode_flops(config, 1) - per_pass
    flops = per_pass * passes.sum(-1) + attention * context.sum(-1).astype(np.float64)
    return lengths.sum(-1), flops


# ----------------------------------------------------------------------------- ST-BoN


def coe_features(hidden):
    """Chain-of-Embedding feature [...] of hidden-state trajectories hidden [..., L+1, D]
    (embedding, then each layer; ST-BoN feeds the mean over a candidate's tokens):

      F = mean_l ||h_l - h_{l+1}|| / ||h_0 - h_L|| - angle(h_l, h_{l+1}) / angle(h_0, h_L),

    angles by arccos of the cosine clipped to +-(1 - 1e-7), norms floored at 1e-8 (as the
    ST-BoN authors' code, github.com/Alsace08/ST-BoN, decoders.py CoECalculator)."""
    norm = lambda x: jnp.maximum(jnp.linalg.norm(x, axis=-1), 1e-8)

    def angle(a, b):
        cos = jnp.sum(a * b, axis=-1) / (norm(a) * norm(b))
        return jnp.arccos(jnp.clip(cos, -1.0 + 1e-7, 1.0 - 1e-7))

    h0, hL = hidden[..., 0, :], hidden[..., -1, :]
    cur, nxt = hidden[..., :-1, :], hidden[..., 1:, :]
    step_norm = jnp.linalg.norm(cur - nxt, axis=-1) / norm(h0 - hL)[..., None]
    step_angle = angle(cur, nxt) / jnp.maximum(angle(h0, hL), 1e-8)[..., None]
    return jnp.mean(step_norm - step_angle, axis=-1)


def coe_dispersion(features):
    """ST-BoN's inconsistency [B,m] of each candidate: mean over the other candidates j of
    (F_i - F_j)^2, features [B,m]; 0 when m = 1. The most consistent candidate has the least."""
    m = features.shape[-1]
    gaps = jnp.square(features[..., :, None] - features[..., None, :])
    return jnp.sum(gaps, axis=-1) / max(m - 1, 1)


def _st_bon_winner(st: _StBon):
    """One-hot [B,m] int32 of the candidate whose mean hidden trajectory so far is the most
    consistent with the others' (least coe_dispersion; ties: lowest row)."""
    mean = st.hidden / jnp.maximum(st.passes, 1)[..., None, None]
    best = jnp.argmin(coe_dispersion(coe_features(mean)), axis=-1)
    return jax.nn.one_hot(best, st.votes.shape[-1], dtype=jnp.int32)


def _st_bon_update(st: _StBon, hidden, live, token, stopped, length) -> _StBon:
    """Adds one forward pass: hidden [B,m,L+1,D] of the pass that drew `token` [B,m] (the
    recorded token, 0 once stopped), live [B,m] (rows still generating before it),
    stopped [B,m] (a stop id just drawn), length: tokens generated after it. Sets the
    earliest estimation time c when all prefixes first differ (or a candidate stops) and
    casts one vote at each length in (c, c + tau], tau = c (the paper's tau_coeff = 1)."""
    m = live.shape[-1]
    hidden_sum = st.hidden + jnp.where(live[..., None, None], hidden, 0.0)
    passes = st.passes + live.astype(jnp.int32)
    same = st.same & (token[:, :, None] == token[:, None, :])
    distinct = ~jnp.any(same & ~jnp.eye(m, dtype=bool), axis=(1, 2))
    first = (st.diverged == 0) & (distinct | jnp.any(stopped, axis=-1))
    diverged = jnp.where(first, length, st.diverged)
    st = _StBon(hidden_sum, passes, same, diverged, st.votes)
    window = (diverged > 0) & (length > diverged) & (length <= 2 * diverged)
    return st._replace(votes=st.votes + jnp.where(window[:, None], _st_bon_winner(st), 0))


def _st_bon_scores(st: _StBon):
    """[B,m] float32 ST-BoN scores at a decision step: the votes; a prompt whose window cast
    none (no divergence yet, or c = the decision step) gets one vote at this step."""
    none = jnp.sum(st.votes, axis=-1, keepdims=True) == 0
    return (st.votes + jnp.where(none, _st_bon_winner(st), 0)).astype(jnp.float32)


# ----------------------------------------------------------------------------- jitted stages


def _certainty(logits):
    """Per-row KL(Uniform_V || softmax(logits)) [R] = logsumexp - mean - log V."""
    V = logits.shape[-1]
    return jax.nn.logsumexp(logits, axis=-1) - jnp.mean(logits, axis=-1) - jnp.log(V)


def _choose(logits, u, temperature, top_k, top_p, greedy):
    """kjax.sampling._choose with the uniforms u [R] given instead of a key."""
    if greedy:
        return sampling._choose(logits, None, temperature, top_k, top_p, True)
    pick = lambda a, token: jnp.take_along_axis(a, token[:, None], axis=-1)[:, 0]
    logp = sampling.processed_logprobs(logits, temperature, top_k, top_p)
    token = sampling.draw(logp, u)
    return token, pick(logp, token), pick(logits, token) - jax.nn.logsumexp(logits, axis=-1)


def _uniforms(key, step, candidates, n_total: int):
    """The uniforms [B*m] of step `step` for the candidates [B,m]: sample_params' vector
    uniform(fold_in(key, step), (B*n_total,)) at rows b*n_total + candidates[b]."""
    B = candidates.shape[0]
    u = jax.random.uniform(jax.random.fold_in(key, step), (B * n_total,)).reshape(B, n_total)
    return jnp.take_along_axis(u, candidates, axis=1).reshape(-1)


_OPTIONS = tuple("config n max_new_tokens top_k top_p stop_ids greedy dtype st_bon".split())


@functools.partial(jax.jit, static_argnames=_OPTIONS)
def _start(params, prompts, prompt_mask, key, temperature, *, config: LlamaConfig, n: int,
           max_new_tokens: int, top_k: int, top_p: float, stop_ids: tuple[int, ...],
           greedy: bool, dtype, st_bon: bool):  # fmt: skip
    """Prefill and token 0 of all n candidates: (PromptCache, _State at step 1).
    st_bon: carry ST-BoN's state (hidden states of every pass)."""
    B, _ = prompts.shape
    T, L = max_new_tokens, config.num_layers
    prefilled = sampling.prefill(params, config, prompts, prompt_mask.astype(bool), dtype,
                                 with_hidden=st_bon)  # fmt: skip
    logits, prompt = prefilled[:2]
    candidates = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (B, n))
    logits = jnp.repeat(logits, n, axis=0)
    u = _uniforms(key, 0, candidates, n)
    first = _choose(logits, u, temperature, top_k, top_p, greedy)
    zeros = lambda dt: jnp.zeros((B, n, T), dt)
    out = Rollouts(zeros(jnp.int32), zeros(jnp.float32), zeros(jnp.float32), zeros(bool),
                   jnp.zeros((B, n), jnp.int32))  # fmt: skip
    out, done = sampling._record(out, 0, jnp.zeros((B, n), bool),
                                 *(a.reshape(B, n) for a in first), stop_ids)  # fmt: skip
    own = jnp.zeros((L, B * n, max(T - 1, 1), config.num_kv_heads, config.head_dim), dtype)
    certainty = _certainty(logits).reshape(B, n)
    st = None
    if st_bon:
        D = config.hidden_size
        hidden = jnp.broadcast_to(prefilled[2].transpose(1, 0, 2)[:, None], (B, n, L + 1, D))
        st = _StBon(jnp.zeros_like(hidden), jnp.zeros((B, n), jnp.int32),
                    jnp.ones((B, n, n), bool), jnp.zeros((B,), jnp.int32),
                    jnp.zeros((B, n), jnp.int32))  # fmt: skip
        st = _st_bon_update(st, hidden, jnp.ones((B, n), bool), out.tokens[:, :, 0], done, 1)
    return prompt, _State(jnp.int32(1), done, own, own, out, certainty, candidates, st)


@functools.partial(jax.jit, static_argnames=(*_OPTIONS, "start", "end"))
def _decode(params, prompt: PromptCache, state: _State, key, temperature, *,
            config: LlamaConfig, n: int, max_new_tokens: int, top_k: int, top_p: float,
            stop_ids: tuple[int, ...], greedy: bool, dtype, st_bon: bool, start: int,
            end: int) -> _State:  # fmt: skip
    """Decodes steps [start, end) of the current candidates (or until all stopped), with
    kjax.sampling's decode phases (own-K/V windows) restricted to those steps. `n` is the
    original candidate count (it shapes the uniforms); the batch has state.done's width."""
    B, m = state.done.shape
    begin = 1
    for window, phase_end in sampling._phases(max_new_tokens):
        lo, hi = max(begin, start), min(phase_end, end)
        begin = phase_end
        if lo >= hi:
            continue

        def cond(s: _State, hi=hi):
            return (s.step < hi) & ~jnp.all(s.done)

        def body(s: _State, window=window):
            fed = jax.lax.dynamic_index_in_dim(s.out.tokens, s.step - 1, 2, keepdims=False)
            passed = sampling._decode_logits(params, config, prompt, s.own_k, s.own_v, fed,
                                             s.step, window, dtype, with_hidden=st_bon)  # fmt: skip
            logits, k, v = passed[:3]
            own_k, own_v = sampling.write_own(s.own_k, s.own_v, k, v, s.step, dtype)
            u = _uniforms(key, s.step, s.candidates, n)
            drawn = _choose(logits, u, temperature, top_k, top_p, greedy)
            out, done = sampling._record(s.out, s.step, s.done,
                                         *(a.reshape(B, m) for a in drawn), stop_ids)  # fmt: skip
            gain = jnp.where(s.done, 0.0, _certainty(logits).reshape(B, m))
            st = s.st
            if st_bon:
                hidden = passed[3].reshape(-1, B, m, config.hidden_size).transpose(1, 2, 0, 3)
                token = jax.lax.dynamic_index_in_dim(out.tokens, s.step, 2, keepdims=False)
                st = _st_bon_update(st, hidden, ~s.done, token, done & ~s.done, s.step + 1)
            return _State(s.step + 1, done, own_k, own_v, out, s.certainty + gain,
                          s.candidates, st)  # fmt: skip

        state = jax.lax.while_loop(cond, body, state)
    return state


@functools.partial(jax.jit, static_argnames=("scorer",))
def _device_scores(state: _State, scorer: Scorer):
    """[B,m] float32 scores of the partial candidates (mean over their valid tokens)."""
    if scorer is Scorer.ST_BON:
        return _st_bon_scores(state.st)
    count = jnp.maximum(state.out.mask.sum(-1), 1)
    if scorer is Scorer.MEAN_LOGPROB:
        total = jnp.sum(jnp.where(state.out.mask, state.out.model_logprobs, 0.0), axis=-1)
    else:
        total = state.certainty
    return total / count


@functools.partial(jax.jit, static_argnames=("keep",))
def _prune(state: _State, scores, keep: int):
    """Keeps the `keep` best-scored candidates of each prompt (ties: lower original index;
    NaN ranks last), in increasing original order. Returns (state, kept [B,m] bool)."""
    B, m = state.done.shape
    scores = jnp.where(jnp.isnan(scores), -jnp.inf, scores.astype(jnp.float32))
    # Rows are in increasing original order, so a stable sort breaks ties by original index.
    order = jnp.argsort(-scores, axis=-1, stable=True)[:, :keep]
    idx = jnp.sort(order, axis=-1)  # [B, keep]
    rows = lambda a: jnp.take_along_axis(a, idx.reshape(idx.shape + (1,) * (a.ndim - 2)), 1)

    def kv(a):  # [L, B*m, C, K, E] -> [L, B*keep, C, K, E], B kept as an axis
        a = a.reshape(a.shape[0], B, m, *a.shape[2:])
        a = jnp.take_along_axis(a, idx[None, :, :, None, None, None], axis=2)
        return a.reshape(a.shape[0], B * keep, *a.shape[3:])

    out = Rollouts(*(rows(a) for a in state.out))
    kept = jnp.zeros((B, m), bool).at[jnp.arange(B)[:, None], idx].set(True)
    st = state.st
    if st is not None:  # `same` is [B,m,m]: survivors' rows, then their columns
        same = jnp.take_along_axis(rows(st.same), idx[:, None, :], axis=2)
        st = _StBon(rows(st.hidden), rows(st.passes), same, st.diverged, rows(st.votes))
    new = _State(state.step, rows(state.done), kv(state.own_k), kv(state.own_v), out,
                 rows(state.certainty), rows(state.candidates), st)  # fmt: skip
    return new, kept


# ----------------------------------------------------------------------------- public API


def validate_schedule(schedule, n: int, max_new_tokens: int) -> tuple[tuple[int, int], ...]:
    """Checks a pruning schedule; returns it as a tuple of (decision_step, keep) int pairs.

    Decision steps must be strictly increasing in [1, max_new_tokens) (a decision at step d
    scores the first d tokens); keep must satisfy 1 <= keep <= the previous stage's keep
    (n for the first)."""
    try:
        pairs = tuple((int(d), int(k)) for d, k in schedule)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"schedule must be a tuple of (decision_step, keep) int pairs, got {schedule!r}"
        ) from e
    prev_step, prev_keep = 0, n
    for i, (d, k) in enumerate(pairs):
        if d <= prev_step:
            raise ValueError(
                f"schedule decision steps must be strictly increasing and >= 1; entry {i} has "
                f"step {d} after {prev_step} in {pairs}"
            )
        if d >= max_new_tokens:
            raise ValueError(
                f"schedule entry {i}: decision step {d} must be < max_new_tokens="
                f"{max_new_tokens} (a decision at the last step prunes nothing worth saving)"
            )
        if not 1 <= k <= prev_keep:
            raise ValueError(
                f"schedule entry {i}: keep={k} must be in [1, {prev_keep}] (the candidates "
                f"alive before it; n={n}); keep may never grow"
            )
        prev_step, prev_keep = d, k
    return pairs


def sample_pruned(params, prompts, prompt_mask, key, temperature=1.0, *, config: LlamaConfig,
                  n: int, max_new_tokens: int, stop_ids: tuple[int, ...] = (),
                  schedule: tuple[tuple[int, int], ...] = (),
                  scorer: Scorer | HostScorer = Scorer.MEAN_LOGPROB, top_k: int = 0,
                  top_p: float = 1.0, greedy: bool = False, dtype=jnp.float32,
                  weights: SamplerWeights = SamplerWeights.AUTO) -> PrunedRollouts:  # fmt: skip
    """Best-of-N decoding with early pruning of partial candidates (host function; each
    stage is a jitted call).

    Args:
      params: a params dict (kjax.models.llama layout). config: its LlamaConfig.
      prompts: [B,S] int32, usually left-padded. prompt_mask: [B,S] bool.
      key: PRNG key. The same key gives every candidate the tokens kjax.sampling's
        sample_params gives it with the same n (see the module docstring).
      temperature: > 0 (greedy=True ignores it). top_k, top_p, stop_ids: as in
        kjax.sampling.sample.
      n: candidates started per prompt. max_new_tokens: T.
      schedule: static ((decision_step, keep), ...): after `decision_step` tokens, keep the
        best `keep` candidates of each prompt. () decodes all n to the end.
      scorer: a Scorer, or a host callable (partial Rollouts [B,m,T], original candidate
        indices [B,m] numpy, decision step) -> [B,m] scores, higher better.
      weights: the layout every stage reads the weights in, placed once before the first
        (as in kjax.sampling.sample; AUTO keeps a CPU's params as they are).
    Returns:
      PrunedRollouts: survivors' Rollouts [B,keep,T], their original indices [B,keep],
      decoded tokens [B] and model FLOPs [B] per prompt.
    """
    if greedy:
        temperature = 1.0
    sampling._validate(config, prompts, prompt_mask, n, max_new_tokens, temperature, top_k,
                       top_p, stop_ids)  # fmt: skip
    pairs = validate_schedule(schedule, n, max_new_tokens)
    if not (isinstance(scorer, Scorer) or callable(scorer)):
        raise ValueError(f"scorer must be a Scorer or a host callable, got {scorer!r}")
    T = max_new_tokens
    options = dict(config=config, n=n, max_new_tokens=T, top_k=int(top_k), top_p=float(top_p),
                   stop_ids=tuple(int(i) for i in stop_ids), greedy=bool(greedy),
                   dtype=dtype, st_bon=scorer is Scorer.ST_BON)  # fmt: skip
    params = sampling.rollout_params(params, config, weights, np.shape(prompts), n, T, dtype)
    prompts = jnp.asarray(prompts, jnp.int32)
    prompt_mask = jnp.asarray(prompt_mask, bool)
    temperature = jnp.asarray(temperature, jnp.float32)
    prompt_len = np.asarray(prompt_mask.sum(-1), np.int64)
    prompt, state = _start(params, prompts, prompt_mask, key, temperature, **options)

    tokens = np.zeros(prompt_len.shape, np.int64)
    flops = prefill_flops(config, prompt_len)
    start = 1
    for decision, keep in pairs:
        state = _decode(params, prompt, state, key, temperature, start=start, end=decision,
                        **options)  # fmt: skip
        if isinstance(scorer, Scorer):
            scores = _device_scores(state, scorer)
        else:
            scores = jnp.asarray(scorer(state.out, np.asarray(state.candidates), decision))
            if scores.shape != state.done.shape:
                raise ValueError(
                    f"host scorer returned shape {scores.shape}, expected {state.done.shape}"
                )
        lengths = np.asarray(state.out.mask.sum(-1))
        state, kept = _prune(state, scores, keep)
        dropped = np.where(np.asarray(kept), 0, lengths)
        t, f = _account(config, dropped, prompt_len)
        tokens, flops = tokens + t, flops + f
        start = decision
    state = _decode(params, prompt, state, key, temperature, start=start, end=T, **options)
    out = state.out._replace(lengths=state.out.mask.sum(-1, dtype=jnp.int32))
    t, f = _account(config, np.asarray(out.lengths), prompt_len)
    return PrunedRollouts(out, state.candidates, tokens + t, flops + f)
