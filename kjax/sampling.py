"""On-device grouped sampler: prefill each prompt once, draw N samples from it, jit end to end.

The prompt K/V [L,B,S,K,E] is stored once per prompt; each of the B*N samples keeps its own
K/V for the tokens it generates. Decode attends to both segments and merges them exactly
(log-sum-exp), inside `lax.while_loop`s that stop as soon as every sample has stopped.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kjax import sampler_layout, sharding
from kjax.models import attention, llama
from kjax.models.config import AttentionBackend, LlamaConfig
from kjax.sampler_layout import sampler_params
from kjax.sampler_weights import SamplerWeights
from kjax.sampling_draw import (  # noqa: F401 (re-exported: kjax.sampling's draw API)
    _NUCLEUS_CANDIDATES,
    _choose,
    _choose_with,
    draw,
    processed_logprobs,
)

_FIRST_WINDOW = 16  # own-K/V window of the first decode phase; it doubles each phase
_OWN_BLOCK = 128  # on TPU, own K/V slots read per block (see _decode_logits)


class Rollouts(NamedTuple):
    """What the trainer needs from N samples of each of B prompts.

    tokens: [B,N,T] int32, 0 after a sample stopped.
    logprobs: [B,N,T] float32, log-probability of each token under the processed
      (temperature/top-k/top-p) distribution it was drawn from; 0 for greedy.
    model_logprobs: [B,N,T] float32, under the raw model at temperature 1.
    mask: [B,N,T] bool, True up to and including a stop token.
    lengths: [B,N] int32, number of True entries of `mask`.
    """

    tokens: jax.Array
    logprobs: jax.Array
    model_logprobs: jax.Array
    mask: jax.Array
    lengths: jax.Array


# ----------------------------------------------------------------------------- model passes


class PromptCache(NamedTuple):
    """Shared per-prompt state: k, v [L,B,S,K,E] (once per prompt, not per sample);
    mask [B,S] bool; next_pos [B] int32, the RoPE position of the first generated token."""

    k: jax.Array
    v: jax.Array
    mask: jax.Array
    next_pos: jax.Array


def prefill(params, config: LlamaConfig, prompts, prompt_mask, dtype=jnp.float32,
            with_hidden: bool = False):  # fmt: skip
    """Runs B prompts once: (next-token logits [B,V] float32, PromptCache).

    prompts: [B,S] int32; prompt_mask: [B,S] bool, any padding pattern (left is usual).
    with_hidden (static): also return the hidden states [L+1,B,D] float32 of each row's
    last real token (see `hidden_trajectory`), as a third element.
    """
    B, S = prompts.shape
    positions = llama.default_positions(prompt_mask)
    mask = jnp.tril(jnp.ones((S, S), bool))[None] & prompt_mask[:, None, :]
    cos, sin = llama.rope_tables(config, positions)
    last = S - 1 - jnp.argmax(prompt_mask[:, ::-1], axis=-1)  # last real token of each row
    at_last = lambda x: jnp.take_along_axis(x, last[:, None, None], axis=1)  # [B,1,D]

    backend = attention.resolve(config, dtype, S)

    def block(x, inputs):
        layer, window = inputs
        q, k, v = llama.layer_qkv(layer, config, x, cos, sin)
        if backend is AttentionBackend.JNP:
            out = llama.attention(q, k, v, llama.windowed(mask, window, positions, positions))
        else:  # the same causal, padding-masked attention through a kernel
            out = attention.grouped_attention(backend, q, k, v, prompt_mask, 0, 0)
        x = sharding.constrain_batch(llama.layer_out(layer, config, x, out))
        return x, ((k, v, at_last(x)[:, 0]) if with_hidden else (k, v))

    x0 = sharding.constrain_batch(llama.embed(params, prompts, dtype))
    x, ys = jax.lax.scan(block, x0, (params["layers"], llama.layer_windows(config)))
    x_last = at_last(x)  # unembed one position only
    logits = llama.unembed(params, config, x_last)[:, 0]
    k, v = (sharding.constrain_cache(a) for a in ys[:2])
    cache = PromptCache(k, v, prompt_mask, positions[jnp.arange(B), last] + 1)
    if not with_hidden:
        return logits, cache
    return logits, cache, hidden_trajectory(params, config, at_last(x0)[:, 0], ys[2])


def hidden_trajectory(params, config: LlamaConfig, x0, per_layer):
    """Hidden states [L+1,R,D] float32 of one position through the network, in
    transformers' `output_hidden_states` convention: the token embedding x0 [R,D], then
    each layer's output (per_layer [L,R,D]), the last one after the final norm."""
    last = llama.rms_norm(per_layer[-1], params["final_norm"], config.rms_norm_eps)
    return jnp.concatenate([x0[None], per_layer[:-1], last[None]]).astype(jnp.float32)


def _decode_logits(params, config, prompt: PromptCache, own_k, own_v, tokens, step, window,
                   dtype, with_hidden: bool = False):  # fmt: skip
    """Feeds token `step - 1` of every sample: tokens [B,N] -> (logits [B*N,V], k, v
    [L,B*N,1,K,E] of the fed token). Attention = prompt K/V (shared by the N samples of a
    prompt: they are the query axis) + own K/V slots [0, step-1) read from a static
    `window` + the fed token itself, merged by log-sum-exp. with_hidden (static): also
    return the fed token's hidden states [L+1,B*N,D] float32 (`hidden_trajectory`)."""
    B, N = tokens.shape
    H, E = config.num_heads, config.head_dim
    x0 = sharding.constrain_batch(llama.embed(params, tokens.reshape(B * N, 1), dtype))
    pos = jnp.repeat(prompt.next_pos, N) + step - 1
    cos, sin = llama.rope_tables(config, pos[:, None])
    prompt_mask = jnp.broadcast_to(prompt.mask[:, None, :], (B, N, prompt.mask.shape[1]))
    past_mask = jnp.broadcast_to(jnp.arange(window) < step - 1, (B * N, 1, window))
    self_mask = jnp.ones((B * N, 1, 1), bool)
    # Positions for a sliding window: the prompt's keys, the N queries of each prompt
    # (one position: they are at the same step), own slot i at next_pos + i.
    prompt_pos = llama.default_positions(prompt.mask)
    query_pos = jnp.broadcast_to((prompt.next_pos + step - 1)[:, None], (B, N))
    own_pos = jnp.arange(window)[None]

    K = config.num_kv_heads

    # On TPU a window over _OWN_BLOCK slots is read in blocks of _OWN_BLOCK, each sliced
    # straight out of the whole cache, merged by log-sum-exp: scanned per layer, a layer's
    # whole window ([B*N, window, K, E], 67 MB per chip for 8B on v6e-64 at window 1023)
    # was copied out into HBM and read again; a block fits on-chip memory. A smaller
    # window, and every window elsewhere, is one block, the layer's window scanned (the
    # CPU's numerics; on TPU a float32 cache read in blocks was converted whole, per step).
    L, blocked = config.num_layers, attention.platform() == "tpu" and window > _OWN_BLOCK
    spans = [(a, min(a + _OWN_BLOCK, window)) for a in range(0, window, _OWN_BLOCK)]

    def own_kv(own):
        """Per layer: the window's [(k, v, first slot, end slot)] blocks."""
        if not blocked:
            return [(own[0], own[1], 0, window)]
        size = lambda a, b: (1, own_k.shape[1], b - a, *own_k.shape[3:])  # noqa: E731
        cut = lambda c, a, b: jax.lax.dynamic_slice(c, (own, 0, a, 0, 0), size(a, b))[0]  # noqa: E731
        return [(cut(own_k, a, b), cut(own_v, a, b), a, b) for a, b in spans]

    def own_attention(q, blocks, mask):
        # Where the cache's rows take the tensor axis (sharding.cache_spec), the queries
        # move to those rows for this attention and back; elsewhere both are no-ops.
        q, parts = sharding.to_cache_rows(q, K), []
        for k, v, a, b in blocks:
            out, lse = llama.attention(q, k, v, mask[..., a:b], with_lse=True)
            parts.append((sharding.from_cache_rows(out, K), sharding.from_cache_rows(lse, K)))
        return parts

    def block(x, inputs):
        layer, lw, pk, pv, own = inputs
        q, k, v = llama.layer_qkv(layer, config, x, cos, sin)
        q = sharding.from_cache_rows(q, K)  # the layout own_attention leaves
        k, v = (sharding.from_cache_rows(a, K, axes=("batch", None, None, None)) for a in (k, v))
        pm = llama.windowed(prompt_mask, lw, query_pos, prompt_pos)
        om = llama.windowed(past_mask, lw, jnp.full((1, 1), step - 1), own_pos)
        out, lse = llama.attention(q.reshape(B, N, H, E), pk, pv, pm, with_lse=True)
        parts = [
            (out.reshape(B * N, 1, H, E), lse.reshape(B * N, 1, H)),
            *own_attention(q, own_kv(own), om),
            llama.attention(q, k, v, self_mask, with_lse=True),
        ]
        x = sharding.constrain_batch(
            llama.layer_out(layer, config, x, llama.merge_attention(parts))
        )
        return x, ((k, v, x[:, 0]) if with_hidden else (k, v))

    # The live window sliced off the whole caches before the layer scan: scanned whole,
    # each layer's [B*N, C, K, E] cache was copied out and laid out again before its
    # window slice, every step (8B on v6e-64: 17 of the 35 GB a step moved at window 16).
    live = lambda cache: cache[:, :, :window]  # noqa: E731
    own = jnp.arange(L) if blocked else (live(own_k), live(own_v))
    xs = (params["layers"], llama.layer_windows(config), prompt.k, prompt.v, own)
    x, ys = jax.lax.scan(block, x0, xs)
    # The draw's rows over the tensor devices too (each drew every row of its batch group)
    logits = sharding.spread_logits(llama.unembed(params, config, x)[:, 0])
    if not with_hidden:
        return logits, ys[0], ys[1]
    return logits, ys[0], ys[1], hidden_trajectory(params, config, x0[:, 0], ys[2])


def write_own(own_k, own_v, k, v, step, dtype):
    """The own K/V caches [L,B*N,C,K,E] with the token fed at `step` (k, v [L,B*N,1,K,E])
    written into slot step - 1, laid out by sharding.cache_spec."""
    at = (0, 0, step - 1, 0, 0)
    own_k = jax.lax.dynamic_update_slice(own_k, k.astype(dtype), at)
    own_v = jax.lax.dynamic_update_slice(own_v, v.astype(dtype), at)
    return sharding.constrain_cache(own_k), sharding.constrain_cache(own_v)


# ----------------------------------------------------------------------------- sampler


class _Loop(NamedTuple):
    """Decode-loop carry: step (int32, index of the token drawn next), done [B,N] (stop
    id emitted), own_k/own_v [L,B*N,C,K,E] (each sample's K/V of the tokens it fed),
    out (Rollouts buffers [B,N,T]; lengths filled at the end)."""

    step: jax.Array
    done: jax.Array
    own_k: jax.Array
    own_v: jax.Array
    out: Rollouts


def own_slots(T: int, tpu: bool = False) -> int:
    """Slots C of each sample's own K/V cache [L,B*N,C,K,E] for T new tokens: T - 1
    (step i writes slot i - 1; the last token is drawn, never fed); on TPU rounded up to
    a multiple of 16 (a bfloat16 tile's rows), of _OWN_BLOCK past it, so that the TPU's
    default layout puts the slots, not the rows, in the minor tile (1023 slots got the
    rows, and every decode step copied the whole cache into the layout its attention
    reads) and the blocks a large window is read in are whole."""
    slots = max(T - 1, 1)
    if not tpu:
        return slots
    unit = _OWN_BLOCK if slots > _OWN_BLOCK else 16
    return -(-slots // unit) * unit


def _phases(T: int, slots: int = 0) -> list[tuple[int, int]]:
    """(own-K/V window, exclusive end step) of each decode loop over an own cache of
    `slots` (default T - 1). Step i reads i - 1 past slots, so a window w serves steps up
    to w + 1; windows double, so the attention work over own K/V stays within 2x of the
    valid prefix while every shape stays static."""
    slots = slots or max(T - 1, 1)
    phases, w = [], min(_FIRST_WINDOW, slots)
    while not phases or phases[-1][1] < T:
        phases.append((w, min(w + 2, T)))
        w = min(2 * w, slots)
    return phases


def _record(out: Rollouts, step, done, token, logprob, model_logprob, stop_ids):
    """Writes column `step` of the buffers; returns (out, done). All values [B,N]."""
    live = ~done
    put = lambda buf, val: jax.lax.dynamic_update_index_in_dim(buf, val.astype(buf.dtype), step, 2)
    out = out._replace(
        tokens=put(out.tokens, jnp.where(live, token, 0)),
        logprobs=put(out.logprobs, jnp.where(live, logprob, 0.0)),
        model_logprobs=put(out.model_logprobs, jnp.where(live, model_logprob, 0.0)),
        mask=put(out.mask, live),
    )
    stopped = jnp.isin(token, jnp.asarray(stop_ids, jnp.int32)) if stop_ids else False
    return out, done | (live & stopped)


@functools.partial(
    jax.jit, static_argnames=("config", "n", "max_new_tokens", "top_k", "top_p", "stop_ids",
                              "greedy", "dtype", "compact_floor", "weights")
)  # fmt: skip
def sample_params(params, prompts, prompt_mask, key, temperature, *, config: LlamaConfig, n: int,
                  max_new_tokens: int, top_k: int = 0, top_p: float = 1.0,
                  stop_ids: tuple[int, ...] = (), greedy: bool = False,
                  dtype=jnp.float32, compact_floor: int = 0,
                  weights: SamplerWeights = SamplerWeights.TRAIN) -> Rollouts:  # fmt: skip
    """The jitted core of `sample` on a params dict (kjax.models.llama layout).

    temperature [] float32 > 0 is traced (changing it does not recompile); greedy=True
    ignores it. The other options are static. compact_floor: 0 decodes all B*N rows to the
    end; f >= 1 moves the live samples into smaller batches as others stop, down to f rows
    (`compact_sizes`; the same tokens, see "Compaction" below). weights: the layout the
    rollout reads the weights in (`sampler_params`; TRAIN or TENSOR, resolved), the same
    tokens either way.
    """
    B, S = prompts.shape
    N, T, L = n, max_new_tokens, config.num_layers
    prompt_mask = prompt_mask.astype(bool)
    params = sampler_params(params, config, weights)
    logits, prompt = prefill(params, config, prompts, prompt_mask, dtype)
    choose = functools.partial(
        _choose, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy
    )

    zeros = lambda dt: jnp.zeros((B, N, T), dt)
    out = Rollouts(zeros(jnp.int32), zeros(jnp.float32), zeros(jnp.float32), zeros(bool),
                   jnp.zeros((B, N), jnp.int32))  # fmt: skip
    first = choose(jnp.repeat(logits, N, axis=0), jax.random.fold_in(key, 0))
    out, done = _record(out, 0, jnp.zeros((B, N), bool),
                        *(a.reshape(B, N) for a in first), stop_ids)  # fmt: skip
    C = own_slots(T, attention.platform() == "tpu")
    own = jnp.zeros((L, B * N, C, config.num_kv_heads, config.head_dim), dtype)
    own = sharding.constrain_cache(own)
    state = _Loop(jnp.int32(1), done, own, own, out)
    sizes = compact_sizes(B * N, compact_floor, sharding.batch_shards()) if compact_floor else ()

    for window, end in _phases(T, C):

        def cond(s: _Loop, end=end):
            go = (s.step < end) & ~jnp.all(s.done)
            return go & (_live(s.done) > sizes[1]) if len(sizes) > 1 else go

        def body(s: _Loop, window=window):
            fed = jax.lax.dynamic_index_in_dim(s.out.tokens, s.step - 1, 2, keepdims=False)
            logits, k, v = _decode_logits(params, config, prompt, s.own_k, s.own_v, fed,
                                          s.step, window, dtype)  # fmt: skip
            own_k, own_v = write_own(s.own_k, s.own_v, k, v, s.step, dtype)
            drawn = choose(logits, jax.random.fold_in(key, s.step))
            out, done = _record(s.out, s.step, s.done, *(a.reshape(B, N) for a in drawn),
                                stop_ids)  # fmt: skip
            return _Loop(s.step + 1, done, own_k, own_v, out)

        state = jax.lax.while_loop(cond, body, state)

    out = state.out
    if len(sizes) > 1:
        u_choose = functools.partial(
            _choose_with, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy
        )
        decode = functools.partial(_decode_rows, params, config, prompt, key, u_choose,
                                   greedy=greedy, stop_ids=stop_ids, dtype=dtype)  # fmt: skip
        out = _compacting_decode(decode, state, sizes, T)
    return out._replace(lengths=out.mask.sum(-1, dtype=jnp.int32))


# ----------------------------------------------------------------------------- compaction
#
# Compaction (compact_floor >= 1). The decode above runs all B*N rows until the last
# sample stops. With compaction, each decode loop also stops when at most half of the
# rows are live; the live samples (their own K/V caches, and which sample each row holds)
# then move into a batch of the next static size, B*N/2, B*N/4, ... (`compact_sizes`), and
# decoding goes on there. Each size runs the same phases (own-K/V windows), so the program
# holds len(sizes) copies of the decode loops: a bounded set of shapes, compiled once.
#
# Same tokens. A row's draw uses the uniform its sample has in the full vector
# uniform(fold_in(key, step), (B*N,)), gathered by the row's sample index, so every
# sample's stream is the static sampler's. Logits: the first size is the static decode
# itself; on a compacted batch each row computes the same per-row ops (projections,
# attention over its prompt's K/V, its own K/V and itself) on fewer rows. They agree
# with the static decode's to float rounding, not bit for bit: XLA:CPU's dot kernels
# round a row differently at another row count (a [M,576] x [576,1536] product gives
# other bits for M < 64 than M = 64; the prompt attention as a [G, E] block per row
# instead of [G*N, E] per prompt too), measured with jax 0.10.2. So log-probs agree to
# ~1e-6, and a token can differ only where a uniform or an argmax tie falls within that
# rounding of a boundary (no token differed in the tests).
#
# The shared prompt K/V. The static decode lets the N samples of a prompt attend to its
# K/V [L,B,S,K,E] as one [N, S] block per prompt, reading it once per prompt per step. A
# compacted batch holds any mix of samples, so at each compaction the prompt K/V is
# gathered per row, [L,r,S,K,E], once, and each row attends to its own copy (N = 1 per
# "prompt" in `_decode_logits`). The cost: r/B times the prompt K/V's memory while that
# size runs (r <= B*N/2, so at most N/2 times), and per step r reads of a prompt's K/V
# instead of B. Against it, every per-row cost of a step (the weight matmuls, the own K/V,
# the head and the draw) shrinks from B*N rows to r. Kept per group instead ([B, N']), a
# batch would need N' = the most live samples of any prompt, which a long tail keeps near
# N; gathered per layer inside the scan, the copy would be paid at every step.


def compact_sizes(rows: int, floor: int, shards: int = 1) -> tuple[int, ...]:
    """The static batch sizes of the compacting decode: rows, rows/2, rows/4, ..., halving
    while the half is a multiple of `shards` (the devices the batch is split over) and at
    least `floor` rows."""
    if floor < 1:
        raise ValueError(f"compact_floor must be >= 1 to compact (0: off), got {floor}")
    sizes = [rows]
    while sizes[-1] % (2 * shards) == 0 and sizes[-1] // 2 >= floor:
        sizes.append(sizes[-1] // 2)
    return tuple(sizes)


def decode_row_steps(lengths, sizes: tuple[int, ...]) -> tuple[int, int]:
    """(live, run) row-steps of the decode loops (steps 1, 2, ...; step 0 is the prefill's
    draw) for rollouts of these lengths [B,N] (numpy): a sample of length l is live for
    steps 1..l-1; the loops run while any is live, on sizes[0] = B*N rows (the static
    decode) or, compacting, on the smallest size that holds the live samples
    (`compact_sizes`). 1 - live/run is the decode's padding fraction."""
    lengths = np.asarray(lengths).reshape(-1)
    live_at = [int(np.sum(lengths > step)) for step in range(1, int(lengths.max()))]
    run = sum(min(r for r in sizes if r >= live) for live in live_at)
    return int(np.sum(np.maximum(lengths - 1, 0))), run


def _live(done):
    return jnp.sum(~done, dtype=jnp.int32)


class _Rows(NamedTuple):
    """Carry of a compacted decode loop: _Loop's fields (done [B,N] and the Rollouts
    buffers [B,N,T] of every sample; own_k/own_v [L,r,C,K,E] of the batch's rows) and
    rows [r] int32, the sample (b*N + j) each row holds: the live ones first, in order,
    then stopped samples as filler (their writes are masked as the static decode masks a
    stopped row's)."""

    step: jax.Array
    done: jax.Array
    own_k: jax.Array
    own_v: jax.Array
    out: Rollouts
    rows: jax.Array


def _compacting_decode(decode, state: _Loop, sizes: tuple[int, ...], T: int) -> Rollouts:
    """Continues the static decode's `state` on the smaller `sizes[1:]`: at each size the
    live samples move in (`_compact`), then the phases run until the next size fits."""
    B, N = state.done.shape
    s = _Rows(*state, rows=jnp.arange(B * N, dtype=jnp.int32))
    for i, r in enumerate(sizes[1:], start=1):
        s = _compact(s, r)
        nxt = sizes[i + 1] if i + 1 < len(sizes) else 0
        s = decode(s, T=T, next_size=nxt)
    return s.out


def _compact(s: _Rows, r: int) -> _Rows:
    """s on r rows: its live samples first, in row order, then stopped ones. It runs when
    at most r of the 2r rows are live (or no step is left), so at least r rows have
    stopped and the r rows chosen are distinct samples."""
    live = ~s.done.reshape(-1)[s.rows]
    order = jnp.argsort(~live, stable=True)[:r]
    take = lambda cache: sharding.constrain_cache(cache[:, order])
    return s._replace(rows=s.rows[order], own_k=take(s.own_k), own_v=take(s.own_v))


def _decode_rows(params, config, prompt: PromptCache, key, choose, s: _Rows, *, T: int,
                 next_size: int, greedy: bool, stop_ids, dtype) -> _Rows:  # fmt: skip
    """The decode phases on the r rows of s, until every step is drawn, every sample has
    stopped, or at most next_size samples are live."""
    B, N = s.done.shape
    group = s.rows // N
    take = lambda a: sharding.constrain_cache(a[:, group])
    row_prompt = PromptCache(take(prompt.k), take(prompt.v), prompt.mask[group],
                             prompt.next_pos[group])  # fmt: skip
    for window, end in _phases(T, s.own_k.shape[2]):

        def cond(s: _Rows, end=end):
            return (s.step < end) & ~jnp.all(s.done) & (_live(s.done) > next_size)

        def body(s: _Rows, window=window):
            fed = s.out.tokens.reshape(B * N, T)[s.rows, s.step - 1]
            logits, k, v = _decode_logits(params, config, row_prompt, s.own_k, s.own_v,
                                          fed[:, None], s.step, window, dtype)  # fmt: skip
            own_k, own_v = write_own(s.own_k, s.own_v, k, v, s.step, dtype)
            u = None
            if not greedy:
                u = jax.random.uniform(jax.random.fold_in(key, s.step), (B * N,))[s.rows]
            out, done = _record_rows(s.out, s.step, s.done, s.rows, *choose(logits, u),
                                     stop_ids)  # fmt: skip
            return _Rows(s.step + 1, done, own_k, own_v, out, s.rows)

        s = jax.lax.while_loop(cond, body, s)
    return s


def _record_rows(out: Rollouts, step, done, rows, token, logprob, model_logprob, stop_ids):
    """`_record` for a compacted batch: token, logprob, model_logprob [r] of the samples
    `rows` [r] go to column `step` of the [B,N,T] buffers; returns (out, done [B,N])."""
    B, N, T = out.tokens.shape
    live = ~done.reshape(-1)[rows]

    def put(buf, val):
        flat = buf.reshape(B * N, T).at[rows, step].set(val.astype(buf.dtype), unique_indices=True)
        return flat.reshape(B, N, T)

    out = out._replace(
        tokens=put(out.tokens, jnp.where(live, token, 0)),
        logprobs=put(out.logprobs, jnp.where(live, logprob, 0.0)),
        model_logprobs=put(out.model_logprobs, jnp.where(live, model_logprob, 0.0)),
        mask=put(out.mask, live),
    )
    stopped = jnp.isin(token, jnp.asarray(stop_ids, jnp.int32)) if stop_ids else False
    done = done.reshape(-1).at[rows].set(~live | stopped, unique_indices=True)
    return out, done.reshape(B, N)


def sample(model: llama.Llama, prompts, prompt_mask, *, key, n: int, max_new_tokens: int,
           temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           stop_ids: tuple[int, ...] = (), compact_floor: int = 0,
           weights: SamplerWeights = SamplerWeights.AUTO) -> Rollouts:  # fmt: skip
    """Draws n completions of each prompt, on device.

    Args:
      model: a kjax Llama (its params may be sharded; B follows the prompts' sharding).
      prompts: [B,S] int32, usually left-padded. prompt_mask: [B,S] bool, False on padding.
      key: PRNG key; the same key gives the same rollouts, on any mesh.
      n: samples per prompt (N). max_new_tokens: T.
      temperature: 0 means greedy. top_k: keep the k most likely tokens (0: all).
      top_p: keep the smallest set of most likely tokens with mass >= top_p (1: all).
      stop_ids: a sample stops after emitting one of these (it is kept, mask True).
      compact_floor: 0 runs every sample's row to the end of the decode; f >= 1 moves
        the live samples into batches of half the rows as others stop, down to f rows
        (`sample_params`): the same rollouts, less compute on stopped samples.
      weights: the layout the rollout reads the weights in (kjax.sampler_weights; AUTO:
        TENSOR where the params are sharded over fsdp and it fits the device's memory,
        else as they are; on CPUs as they are), placed once before the rollout
        (kjax.sampler_layout.for_rollout): the same rollouts either way.
    Returns:
      Rollouts with [B,N,T] arrays and lengths [B,N].
    """
    config = model.config
    # Greedy is a static branch; any positive temperature shares one compilation.
    greedy = not isinstance(temperature, jax.core.Tracer) and float(temperature) == 0.0
    _validate(config, prompts, prompt_mask, n, max_new_tokens, temperature, top_k, top_p,
              stop_ids)  # fmt: skip
    if not isinstance(compact_floor, int | np.integer) or compact_floor < 0:
        raise ValueError(f"compact_floor must be an int >= 0 (0: off), got {compact_floor!r}")
    params = rollout_params(model.params(), config, weights, np.shape(prompts), n,
                            max_new_tokens, model.dtype)  # fmt: skip
    return sample_params(
        params, jnp.asarray(prompts, jnp.int32), prompt_mask, key,
        jnp.asarray(1.0 if greedy else temperature, jnp.float32), config=config, n=n,
        max_new_tokens=max_new_tokens, top_k=top_k, top_p=float(top_p),
        stop_ids=tuple(int(i) for i in stop_ids), greedy=greedy, dtype=model.dtype,
        compact_floor=compact_floor,
    )  # fmt: skip


def rollout_params(params, config: LlamaConfig, weights: SamplerWeights, prompt_shape, n: int,
                   max_new_tokens: int, dtype):  # fmt: skip
    """params in the rollout's layout on their own mesh (kjax.sampler_layout.for_rollout)
    for B x S prompts (prompt_shape), n samples of max_new_tokens each: the K/V caches of
    such a rollout are what AUTO weighs against the device's memory."""
    if not isinstance(weights, SamplerWeights):
        names = ", ".join(f"SamplerWeights.{w.name}" for w in SamplerWeights)
        raise ValueError(f"weights must be one of {names}; got {weights!r}")
    mesh = sampler_layout.params_mesh(params)
    if mesh is None:
        return params
    B, S = prompt_shape
    L, K, E = config.num_layers, config.num_kv_heads, config.head_dim
    slots = own_slots(max_new_tokens, mesh.devices.flat[0].platform == "tpu")
    shapes = ((L, B, S, K, E), (L, B * n, slots, K, E))
    return sampler_layout.for_rollout(params, config, weights, shapes, jnp.dtype(dtype).itemsize)


def _validate(config: LlamaConfig, prompts, prompt_mask, n, max_new_tokens, temperature,
              top_k, top_p, stop_ids):  # fmt: skip
    """Raises ValueError naming the argument for any input a user can get wrong."""
    if not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"n (samples per prompt) must be an int >= 1, got {n!r}")
    if not isinstance(max_new_tokens, int | np.integer) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if np.ndim(prompts) != 2 or np.shape(prompt_mask) != np.shape(prompts):
        raise ValueError(
            f"prompts must be [B,S] and prompt_mask the same shape, got {np.shape(prompts)} "
            f"and {np.shape(prompt_mask)}"
        )
    B, S = np.shape(prompts)
    if B == 0 or S == 0:
        raise ValueError(f"prompts is empty (shape {(B, S)}): each prompt needs >= 1 token")
    if not isinstance(prompt_mask, jax.core.Tracer):
        # A device-side reduction to one bool: works for sharded (multi-host) masks too.
        has_token = jnp.any(jnp.asarray(prompt_mask, bool), axis=1)
        if not bool(jnp.all(has_token)):
            rows = np.flatnonzero(~np.asarray(has_token))[:8].tolist()
            raise ValueError(f"empty prompt: prompt_mask rows {rows} have no real tokens")
    context = config.max_position_embeddings
    if S > context:
        raise ValueError(f"prompts length S={S} exceeds the model's context of {context} tokens")
    if S + max_new_tokens > context:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} plus the prompt length S={S} exceeds the model's "
            f"context of {context} tokens; lower max_new_tokens or truncate the prompts"
        )
    if not 0.0 < float(top_p) <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if not isinstance(top_k, int | np.integer) or not 0 <= top_k <= config.vocab_size:
        raise ValueError(
            f"top_k must be an int in [0, vocab_size={config.vocab_size}], got {top_k!r}"
        )
    if not isinstance(temperature, jax.core.Tracer) and float(temperature) < 0:
        raise ValueError(f"temperature must be >= 0 (0 is greedy), got {temperature!r}")
    bad = [i for i in stop_ids if not 0 <= int(i) < config.vocab_size]
    if bad:
        raise ValueError(f"stop_ids {bad} are outside the vocabulary [0, {config.vocab_size})")
