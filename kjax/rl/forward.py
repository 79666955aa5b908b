"""Per-token log-probabilities (and entropies) of sampled completions under the policy.

`completion_logprobs(params, config, prompts [B,S], prompt_mask [B,S], tokens [B,N,T])`
-> TokenStats(logprobs [B,N,T], entropy [B,N,T] | None), both float32. Positions count
real (non-padding) prompt tokens and token 0 is predicted from the last real prompt
token, as in the sampler, so these are the sampler's raw-model log-probs.

Two forward paths, equal up to float rounding (tests/rl/test_forward.py):
- shared_prompt=True: each prompt runs once ([B,S]); its N completions ([B*N,T]) attend
  the prompt's K/V (no copy: the N*T completion queries of a prompt are one query axis)
  plus their own causal K/V, merged by log-sum-exp (llama.merge_attention). Prompt and
  completion rows share every projection/MLP matmul. Gradients flow into the prompt's
  activations through its K/V. Only the T predicting positions are unembedded, in chunks
  of rows x vocabulary columns with an online log-sum-exp and a hand-written backward
  (chunked_token_stats), so neither pass holds [B,N,T,V] float32 logits.
- shared_prompt=False: the reference, the prompt repeated N times, one full forward over
  [B*N, S+T] and logits at every position (what the trainer did before).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from kjax import sharding
from kjax.models import attention, llama
from kjax.models.config import AttentionBackend, LlamaConfig

_CHUNK_ELEMENTS = 1 << 23  # default chunk: ~32 MiB of float32 logits (2048 x 4096)


class TokenStats(NamedTuple):
    """logprobs [B,N,T] float32: log pi(token_t | prompt, tokens_<t);
    entropy [B,N,T] float32 of pi(. | prompt, tokens_<t), or None when not asked."""

    logprobs: jax.Array
    entropy: jax.Array | None


def _last_real(prompt_mask):
    """Index [B] int32 of each row's last real prompt token (S-1 for left padding)."""
    S = prompt_mask.shape[1]
    return (S - 1 - jnp.argmax(prompt_mask[:, ::-1], axis=-1)).astype(jnp.int32)


# ----------------------------------------------------------------------------- reference


def repeated_logits(params, config: LlamaConfig, prompts, prompt_mask, tokens, *,
                    dtype=jnp.float32, remat: bool = False):  # fmt: skip
    """Reference: logits [B,N,T,V] float32 from one full forward over [B*N, S+T], the
    prompt repeated per sample, logits at every position."""
    B, N, T = tokens.shape
    S = prompts.shape[1]
    pmask = jnp.repeat(prompt_mask.astype(bool), N, axis=0)
    seq = jnp.concatenate([jnp.repeat(prompts, N, axis=0), tokens.reshape(B * N, T)], axis=1)
    attn = jnp.concatenate([pmask, jnp.ones((B * N, T), bool)], axis=1)
    logits = llama.forward(params, config, seq, attention_mask=attn, dtype=dtype, remat=remat)
    first = jnp.take_along_axis(logits, _last_real(pmask)[:, None, None], axis=1)
    logits = jnp.concatenate([first, logits[:, S : S + T - 1]], axis=1)
    return logits.reshape(B, N, T, -1)


def stats_of_logits(logits, tokens, with_entropy: bool = False, temperature: float = 1.0):
    """Plain (unchunked) TokenStats of softmax(logits / temperature), logits [..., T, V] and
    tokens [..., T]."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    lp = jnp.take_along_axis(logp, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
    ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1) if with_entropy else None
    return TokenStats(lp, ent)


# ----------------------------------------------------------------------------- fast path


@functools.cache
def _layer_axes(config: LlamaConfig) -> dict[str, tuple]:
    """Logical axes of one layer's weights ({name: axes}, the stacked "layers" axis
    dropped), as the Llama module declares them (no array is allocated)."""
    model = nnx.eval_shape(lambda: llama.Llama(config, rngs=nnx.Rngs(0)))
    state = nnx.to_flat_state(nnx.state(model.layers, nnx.Param))
    return {path[-1]: v.get_metadata().get("axes", (None,))[1:] for path, v in state}


def shared_prompt_hidden(params, config: LlamaConfig, prompts, prompt_mask, tokens, *,
                         dtype=jnp.float32, remat: bool = False):  # fmt: skip
    """Final hidden states [B,N,T,D] (before the final norm) of the positions predicting
    tokens [B,N,T]: the last real prompt token, then completion tokens 0..T-2.

    One scan over layers carries each prompt's S rows and its N*T completion rows as one
    [B, S + N*T, D] batch, so projections and MLP are shared matmuls and B stays the
    leading (sharded) axis throughout.
    """
    B, N, T = tokens.shape
    S = prompts.shape[1]
    pmask = prompt_mask.astype(bool)
    p_pos = llama.default_positions(pmask)  # [B,S]
    c_pos = jnp.sum(pmask, axis=-1, dtype=jnp.int32)[:, None, None] + jnp.arange(T)
    positions = jnp.concatenate([p_pos, jnp.broadcast_to(c_pos, (B, N, T)).reshape(B, -1)], 1)
    cos, sin = llama.rope_tables(config, positions)  # [B, S + N*T, E]
    ids = jnp.concatenate([prompts, tokens.reshape(B, N * T)], axis=1).astype(jnp.int32)
    p_self = jnp.tril(jnp.ones((S, S), bool))[None] & pmask[:, None, :]  # [B,S,S]
    c_prompt = jnp.broadcast_to(pmask[:, None, :], (B, N * T, S))  # N*T queries per prompt
    c_self = jnp.tril(jnp.ones((T, T), bool))[None]  # [1,T,T]

    q_c = positions[:, S:]  # [B, N*T] completion positions (for a sliding window)
    t = jnp.arange(T)[None]
    backend = attention.resolve(config, dtype, S + N * T)

    axes = _layer_axes(config)
    # The residual stream's positions split over tensor between layers (its saved copy
    # per layer is 1/tensor of [B, S + N*T, D]), gathered for the projections.
    seq = dict(gather=sharding.gather_sequence, scatter=sharding.scatter_sequence)

    def block(x, inputs):
        layer, w = inputs
        layer = sharding.gather_over_fsdp(layer, axes)  # weights gathered, not activations
        if backend is AttentionBackend.SPLASH:  # kv heads as many as the kernel's heads
            layer = attention.kv_weights_per_query_head(
                layer, config.num_heads, config.num_kv_heads
            )
        # [B, S + N*T, ., E]
        q, k, v = llama.layer_qkv(layer, config, x, cos, sin, gather=seq["gather"])
        if backend is not AttentionBackend.JNP:  # one kernel call, the same mask
            out = attention.grouped_attention(backend, q, k, v, pmask, N, T)
            return sharding.constrain_residual(llama.layer_out(layer, config, x, out, **seq)), None
        masks = GroupMasks(p_self, p_pos, c_prompt, q_c, c_self, t)
        out = prompt_then_blocks_attention(q, k, v, S, T, w, masks)
        return sharding.constrain_residual(llama.layer_out(layer, config, x, out, **seq)), None

    xs = (params["layers"], llama.layer_windows(config))
    x0 = sharding.constrain_residual(llama.embed(params, ids, dtype))
    x = llama.scan_layers(block, x0, xs, remat=remat)
    D = x.shape[-1]
    xp, xc = x[:, :S], x[:, S:].reshape(B, N, T, D)
    last = jnp.take_along_axis(xp, _last_real(pmask)[:, None, None], axis=1)  # [B,1,D]
    first = jnp.broadcast_to(last[:, None], (B, N, 1, D))
    return jnp.concatenate([first, xc[:, :, : T - 1]], axis=2)


class GroupMasks(NamedTuple):
    """The jnp reference's masks of rows laid out as one prompt of S positions then G
    blocks of T completion positions: p_self [B,S,S] (prompt causal, padding), p_pos [B,S]
    prompt positions, c_prompt [B,G*T,S] (completion queries to the prompt), q_c [B,G*T]
    completion positions, c_self [1 or B*G,T,T] (within a block) and own_pos [1 or B*G,T]
    its positions (for a sliding window)."""

    p_self: jax.Array
    p_pos: jax.Array
    c_prompt: jax.Array
    q_c: jax.Array
    c_self: jax.Array
    own_pos: jax.Array


def prompt_then_blocks_attention(q, k, v, S: int, T: int, window, m: GroupMasks):
    """Attention [B, S + G*T, H, E] of q [B, S + G*T, H, E], k, v [B, S + G*T, K, E] in
    the prompt-then-blocks layout (the jnp reference): the prompt causally, each block's
    queries over the prompt and over their own block, the two merged by log-sum-exp."""
    B, L, H, E = q.shape
    G = (L - S) // T
    qp, kp, vp = (a[:, :S] for a in (q, k, v))
    qc, kc, vc = (a[:, S:].reshape(B * G, T, -1, E) for a in (q, k, v))
    out_p = llama.attention(qp, kp, vp, llama.windowed(m.p_self, window, m.p_pos, m.p_pos))
    c_p = llama.windowed(m.c_prompt, window, m.q_c, m.p_pos)
    o1, l1 = llama.attention(qc.reshape(B, G * T, H, E), kp, vp, c_p, with_lse=True)
    own = llama.windowed(m.c_self, window, m.own_pos, m.own_pos)
    o2, l2 = llama.attention(qc, kc, vc, own, with_lse=True)
    out_c = llama.merge_attention([(o1.reshape(B * G, T, H, E), l1.reshape(B * G, T, H)), (o2, l2)])
    return jnp.concatenate([out_p, out_c.reshape(B, G * T, H, E)], axis=1)


def chunked_token_stats(params, config: LlamaConfig, hidden, targets, *,
                        with_entropy: bool = False, chunk_rows: int | None = None,
                        chunk_vocab: int | None = None,
                        temperature: float = 1.0):  # fmt: skip
    """TokenStats [...] of final hidden states hidden [..., D] and targets [...] int, under
    softmax(logits / temperature) (the normed hidden states are divided by temperature,
    which divides every logit and leaves the head's chunked backward as it is).

    Each device's rows go `chunk_rows` at a time (lax.map; None: up to 4096 rows per
    chunk, counted per device) through `_head_stats`, which walks its vocabulary columns
    `chunk_vocab` at a time (None: ~32 MiB of float32 logits per chunk) with an online
    log-sum-exp. Forward and backward hold O(chunk_rows x chunk_vocab) float32 logits,
    never [rows, V], and read the device's part of the [V,D] unembedding once per pass per
    row chunk (row chunks alone re-read it per chunk: on a CPU that was 1.4x slower than
    materialising all logits at 2048 x 49152).

    Under a mesh (`sharding.head_layout`) the rows stay on their batch devices and the
    vocabulary is split over the tensor axis (`_sharded_stats`): each chip holds V/tensor
    rows of the head and a [V/tensor, D] gradient. Without one the code is that of a
    single device.
    """
    lead, D = hidden.shape[:-1], hidden.shape[-1]
    h = llama.rms_norm(hidden.reshape(-1, D), params["final_norm"], config.rms_norm_eps)
    if temperature != 1.0:
        h = h / jnp.asarray(temperature, h.dtype)
    t = targets.reshape(-1).astype(jnp.int32)
    R, V = h.shape[0], config.vocab_size
    for name, value in (("chunk_rows", chunk_rows), ("chunk_vocab", chunk_vocab)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1 or None; got {value}.")
    # The head as [V,D] rows (the tied embedding as stored; an lm_head [D,V] transposed).
    w = params["embed"] if config.tie_embeddings else params["lm_head"].T
    rows, vocab = sharding.head_layout(R, V)
    local = functools.partial(_local_stats, chunk_rows=chunk_rows, chunk_vocab=chunk_vocab,
                              with_entropy=with_entropy)  # fmt: skip
    if not rows and not vocab:
        lp, ent = local(h, w, t)
    else:
        lp, ent = _sharded_stats(local, h, w, t, rows, vocab)
    return TokenStats(lp.reshape(lead), ent.reshape(lead) if with_entropy else None)


def _local_stats(h, w, t, *, chunk_rows, chunk_vocab, with_entropy, vocab_axes=()):
    """(log-probs [R], entropies [R] or zeros) of one device's rows h [R,D] against its
    head columns w [V',D] (all V without a mesh), in contiguous row chunks."""
    R = h.shape[0]
    c = min(chunk_rows or _MAX_CHUNK_ROWS, R)
    vc = min(w.shape[0], chunk_vocab or max(_MIN_CHUNK_VOCAB, _CHUNK_ELEMENTS // c))
    pad = -R % c

    def chunked(a):  # [R, ...] -> [chunks, c, ...]
        a = jnp.pad(a, ((0, pad), *((0, 0),) * (a.ndim - 1)))
        return a.reshape(-1, c, *a.shape[1:])

    hs, ts = chunked(h), chunked(t)
    one = lambda a: _head_stats(a[0], w, a[1], vc, with_entropy, vocab_axes)  # noqa: E731
    if hs.shape[0] == 1:  # one row chunk: no loop to compile
        lp, ent = jax.tree.map(lambda a: a[None], one((hs[0], ts[0])))
    else:
        lp, ent = jax.lax.map(one, (hs, ts))
    ent = ent if with_entropy else jnp.zeros_like(lp)
    return lp.reshape(-1)[:R], ent.reshape(-1)[:R]


def _sharded_stats(local, h, w, t, rows: tuple[str, ...], vocab: tuple[str, ...]):
    """`local` on each device of the traced mesh: its rows of h [R,D] and t [R] (rows
    over the `rows` axes), its V/|vocab| head rows of w [V,D] (over the `vocab` axes,
    gathered over the rest: the fsdp-sharded D of the stored head), combining the
    vocabulary shards' log-sum-exp inside `_head_stats`.

    Before, each row chunk was spread over every chip against a replicated head: each
    chip read the whole head per 64 rows, held a full [V,D] gradient per row chunk and
    all-reduced it (on the 8B update: about a third of the HBM bytes). Here a chip reads
    its [V/tensor, D] head once per pass per row chunk of its own rows, and the head's
    gradient is summed over the row devices once per call."""
    row_spec = P(rows or None)
    w_spec = P(vocab or None, None)

    def body(h, w, t):
        # Varying over the row axes: each device's cotangent is its own rows' part of
        # d_w, which the transpose of this cast sums over them once per call.
        w = jax.lax.pcast(w, rows, to="varying") if rows else w
        return local(h, w, t, vocab_axes=vocab)

    fn = jax.shard_map(body, in_specs=(row_spec, w_spec, row_spec), out_specs=(row_spec,
                       row_spec))  # fmt: skip
    return fn(h, w, t)


_MAX_CHUNK_ROWS = 4096
_MIN_CHUNK_VOCAB = 128


def _vocab_pass(fn, carry, w, vc: int):
    """Runs carry, out = fn(carry, w_chunk [vc',D], offset) over the column chunks of the
    head w [V,D] (a lax.scan over the full chunks, then the static tail); returns the
    final carry and the chunks' outputs concatenated along the first axis (or None)."""
    V = w.shape[0]
    full, tail = divmod(V, vc)
    outs = []
    if full > 1:
        body = lambda c, i: fn(c, jax.lax.dynamic_slice_in_dim(w, i * vc, vc), i * vc)  # noqa: E731
        carry, out = jax.lax.scan(body, carry, jnp.arange(full))
        outs.append(None if out is None else out.reshape(full * vc, *out.shape[2:]))
    # Static chunks: a lone full one (no loop to compile for small vocabularies), the tail.
    for start in ([0] if full == 1 else []) + ([full * vc] if tail else []):
        carry, out = fn(carry, w[start : start + vc], start)
        outs.append(out)
    outs = [out for out in outs if out is not None]
    return carry, (jnp.concatenate(outs) if outs else None)


def _chunk_logits(h, w_chunk):
    return jnp.matmul(h, w_chunk.astype(h.dtype).T, preferred_element_type=jnp.float32)


def _in_chunk(t, offset, size):
    """Whether each target t [R] falls in columns [offset, offset + size), and its column."""
    return (t >= offset) & (t < offset + size), jnp.clip(t - offset, 0, size - 1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _head_stats(h, w, t, vc: int, with_entropy: bool, vocab_axes: tuple[str, ...] = ()):
    """(log-probs [R], entropies [R] or None) float32 of targets t [R] under logits h @ w.T,
    h [R,D] normed final hidden states, w [V,D]; see chunked_token_stats. Inside
    shard_map with `vocab_axes`, w is this device's block of V/|vocab_axes| rows of the
    head, and the statistics are combined over those axes."""
    return _head_stats_fwd(h, w, t, vc, with_entropy, vocab_axes)[0]


def _varying_like(tree, *refs):
    """tree's arrays cast to vary over the manual mesh axes any of `refs` varies over
    (inside shard_map, a loop's initial carry must be typed as its body's output); the
    identity outside shard_map."""
    axes = frozenset().union(*(jax.typeof(r).manual_axis_type.varying for r in refs))

    def one(x):
        missing = tuple(sorted(axes - jax.typeof(x).manual_axis_type.varying))
        return jax.lax.pcast(x, missing, to="varying") if missing else x

    return jax.tree.map(one, tree)


def _shard_targets(t, w, vocab_axes):
    """Targets t [R] as columns of this device's head block w (out of range elsewhere)."""
    if not vocab_axes:
        return t
    return t - jax.lax.axis_index(vocab_axes) * w.shape[0]


def _head_stats_fwd(h, w, t, vc, with_entropy, vocab_axes=()):
    R = h.shape[0]
    t_local = _shard_targets(t, w, vocab_axes)

    def step(carry, w_chunk, offset):
        top, total, picked, weighted = carry  # running max, sum exp, target logit, sum exp*l
        logits = _chunk_logits(h, w_chunk)
        new_top = jnp.maximum(top, jnp.max(logits, axis=-1))
        scale = jnp.exp(top - new_top)
        e = jnp.exp(logits - new_top[:, None])
        inside, col = _in_chunk(t_local, offset, logits.shape[1])
        picked = jnp.where(inside, jnp.take_along_axis(logits, col[:, None], -1)[:, 0], picked)
        if with_entropy:
            weighted = weighted * scale + jnp.sum(e * logits, axis=-1)
        return (new_top, total * scale + jnp.sum(e, axis=-1), picked, weighted), None

    zeros = jnp.zeros((R,), jnp.float32)
    init = _varying_like((jnp.full((R,), -jnp.inf, jnp.float32), zeros, zeros, zeros), h, w)
    (top, total, picked, weighted), _ = _vocab_pass(step, init, w, vc)
    if vocab_axes:  # each block's sums rescaled to the largest logit of all blocks
        new_top = jax.lax.pmax(top, vocab_axes)
        scale = jnp.exp(top - new_top)
        top, total = new_top, jax.lax.psum(total * scale, vocab_axes)
        picked = jax.lax.psum(picked, vocab_axes)  # 0 on every block but the target's
        weighted = jax.lax.psum(weighted * scale, vocab_axes) if with_entropy else weighted
    lse = top + jnp.log(total)
    lp = picked - lse
    ent = lse - weighted / total if with_entropy else None
    return (lp, ent), (h, w, t, lse, ent)


def _head_stats_bwd(vc, with_entropy, vocab_axes, res, grads):
    # d lp / d logit_j = onehot_j - p_j;  d H / d logit_j = -p_j (log p_j + H).
    h, w, t, lse, ent = res
    g_lp, g_ent = grads
    t_local = _shard_targets(t, w, vocab_axes)

    def step(d_h, w_chunk, offset):
        logp = _chunk_logits(h, w_chunk) - lse[:, None]
        p = jnp.exp(logp)
        inside, col = _in_chunk(t_local, offset, logp.shape[1])
        onehot = (jnp.arange(logp.shape[1]) == col[:, None]) & inside[:, None]
        d_logits = g_lp[:, None] * (onehot - p)
        if with_entropy:
            d_logits = d_logits - g_ent[:, None] * p * (logp + ent[:, None])
        d_logits = d_logits.astype(h.dtype)
        d_h = d_h + jnp.matmul(
            d_logits, w_chunk.astype(h.dtype), preferred_element_type=jnp.float32
        )
        return d_h, jnp.matmul(d_logits.T, h, preferred_element_type=jnp.float32).astype(w.dtype)

    d_h, d_w = _vocab_pass(step, _varying_like(jnp.zeros(h.shape, jnp.float32), h, w), w, vc)
    if vocab_axes:  # each vocabulary block's part of d_h, summed once per row chunk
        d_h = jax.lax.psum(d_h, vocab_axes)
    return d_h.astype(h.dtype), d_w, None


_head_stats.defvjp(_head_stats_fwd, _head_stats_bwd)


def completion_logprobs(
    params,
    config: LlamaConfig,
    prompts,
    prompt_mask,
    tokens,
    *,
    dtype=jnp.float32,
    shared_prompt: bool = True,
    with_entropy: bool = False,
    chunk_rows: int | None = None,
    chunk_vocab: int | None = None,
    remat: bool = False,
    temperature: float = 1.0,
) -> TokenStats:
    """Token log-probs (and entropies) of completions tokens [B,N,T] after prompts [B,S].

    Args:
      params, config: the policy (kjax.models.llama layout).
      prompts: [B,S] int32, any padding (left is usual). prompt_mask: [B,S] bool/int, 0 on
        padding; each row needs >= 1 real token.
      tokens: [B,N,T] int32, N completions per prompt (tokens after a stop are scored too;
        mask them in the loss).
      dtype: compute dtype of the model (log-probs are float32 regardless).
      shared_prompt: run each prompt once and let its N completions attend its K/V, with
        completion-only chunked log-probs (False: the reference, prompt repeated N times
        and full logits).
      with_entropy: also return per-token entropies.
      chunk_rows, chunk_vocab: rows (of a device's B*N*T) and vocabulary columns (of its
        V/tensor) unembedded at once on the shared path (see chunked_token_stats; None:
        the defaults there).
      remat: recompute each layer in the backward pass (less memory, more time).
      temperature: static float > 0: the log-probs (and entropies) are those of
        softmax(logits / temperature), the sampler's distribution at that temperature
        (top-k/top-p are not applied: the trainer refuses them).
    Returns:
      TokenStats(logprobs [B,N,T] float32, entropy [B,N,T] float32 or None).
    """
    if prompts.ndim != 2 or prompt_mask.shape != prompts.shape or tokens.ndim != 3:
        raise ValueError(
            f"prompts and prompt_mask must be [B,S] and tokens [B,N,T]; got {prompts.shape}, "
            f"{prompt_mask.shape} and {tokens.shape}."
        )
    if tokens.shape[0] != prompts.shape[0]:
        raise ValueError(
            f"tokens [B,N,T] {tokens.shape} and prompts [B,S] {prompts.shape} disagree on B."
        )
    if isinstance(temperature, bool) or not (
        isinstance(temperature, (int, float)) and temperature > 0
    ):
        raise ValueError(f"`temperature` must be a static float > 0; got {temperature!r}.")
    if not shared_prompt:
        logits = repeated_logits(params, config, prompts, prompt_mask, tokens, dtype=dtype,
                                 remat=remat)  # fmt: skip
        return stats_of_logits(logits, tokens, with_entropy, temperature)
    hidden = shared_prompt_hidden(params, config, prompts, prompt_mask, tokens, dtype=dtype,
                                  remat=remat)  # fmt: skip
    return chunked_token_stats(params, config, hidden, tokens, with_entropy=with_entropy,
                               chunk_rows=chunk_rows, chunk_vocab=chunk_vocab,
                               temperature=temperature)  # fmt: skip
