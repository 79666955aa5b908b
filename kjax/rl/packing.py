"""The packed update forward: a group's N completions laid end to end in R <= N rows of T.

The padded shared-prompt forward (kjax.rl.forward) runs all N x T completion positions of
a group, padding included. Here each completion keeps only its real span (up to its last
mask token) and the spans of one group are packed into R rows by first-fit decreasing
(`plan`): a slot knows its segment (which completion) and offset (position after the
prompt). Each prompt still runs once per group and every packed row attends its K/V;
own attention is causal within a segment (block-diagonal), so every real token sees
exactly the keys it sees padded, at the same RoPE positions: log-probs, entropies and
gradients equal the padded path's to float rounding (tests/rl/test_packing.py).

Attention is the jnp reference on every platform (layer weights gathered over fsdp as
the padded forward gathers them): splash's segment ids mask by equality AND-ed with its
static mask, which cannot say "any prompt key, or a key of my own segment", and the
padded path's two-call log-sum-exp merge needs an LSE the kernel does not differentiate.

R is static. `rows_needed` (jitted, one scalar to the host) and `bucket` pick it from a
batch's mask out of {N/4, N/2, 3N/4, N} (rounded up), so a run compiles the update at
most four times; `PackedStep` wraps the jitted update to do that per call.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from kjax import sharding
from kjax.models import llama
from kjax.models.config import LlamaConfig
from kjax.rl import forward


class Plan(NamedTuple):
    """Where each completion of a [B,N,T] batch sits in [B,R,T] packed rows.

    row, start, length: [B,N] int32: completion (b, i) fills slots start .. start+length-1
      of row `row` of group b; length is its span (last mask token + 1; 0 if none).
    fill: [B,R] int32 slots used per row. fits: [B,N] bool, False where R rows were too
      few for the span (its log-probs come back NaN rather than silently wrong).
    """

    row: jax.Array
    start: jax.Array
    length: jax.Array
    fill: jax.Array
    fits: jax.Array


def span_lengths(mask):
    """[B,N] int32: index of each completion's last True in mask [B,N,T] + 1 (0 if none).
    A span, not a count, so a mask with holes still has every masked token placed."""
    T = mask.shape[-1]
    last = T - jnp.argmax(mask[..., ::-1], axis=-1)
    return jnp.where(jnp.any(mask, axis=-1), last, 0).astype(jnp.int32)


def plan(mask, rows: int) -> Plan:
    """First-fit decreasing of each group's spans into `rows` rows of T slots.

    mask: [B,N,T] bool. rows: static int >= 1. Spans go longest first (ties by index) into
    the first row with room; a row opens only when no open one has room, so the rows a
    group uses are a prefix, and with rows >= rows_needed(mask) the plan is the same for
    any `rows` (what lets the host size R from a plan with R = N).
    """
    B, N, T = mask.shape
    length = span_lengths(mask)
    order = jnp.argsort(-length, axis=1, stable=True)  # [B,N]

    def place(fill, i):  # i [B]: the next completion of each group
        span = jnp.take_along_axis(length, i[:, None], axis=1)[:, 0]
        room = fill + span[:, None] <= T  # [B,R]
        r = jnp.argmax(room, axis=1).astype(jnp.int32)  # first row with room
        s = jnp.take_along_axis(fill, r[:, None], axis=1)[:, 0]
        fill = fill + (jnp.arange(rows) == r[:, None]) * span[:, None]
        return fill, (r, s, jnp.any(room, axis=1))

    fill0 = jnp.zeros((B, rows), jnp.int32)
    fill, (r, s, ok) = jax.lax.scan(place, fill0, order.T)
    b = jnp.arange(B)[:, None]

    def unsort(x):  # [N,B] in placement order -> [B,N] by completion index
        return jnp.zeros((B, N), x.dtype).at[b, order].set(x.T)

    return Plan(unsort(r), unsort(s), length, fill, unsort(ok))


@jax.jit
def rows_needed(mask) -> jax.Array:
    """[] int32: the most rows any group of mask [B,N,T] needs under `plan` (>= 1)."""
    used = jnp.sum(plan(mask, mask.shape[1]).fill > 0, axis=1)
    return jnp.maximum(jnp.max(used), 1).astype(jnp.int32)


def buckets(n: int) -> tuple[int, ...]:
    """The row counts R a group of n completions may be packed into: N/4, N/2, 3N/4, N
    rounded up, a bounded set of static shapes (one compilation each)."""
    return tuple(sorted({max(1, math.ceil(n * q / 4)) for q in range(1, 5)}))


def bucket(needed: int, n: int) -> int:
    """The smallest of buckets(n) >= needed rows."""
    if not 1 <= needed <= n:
        raise ValueError(f"`needed` rows must be in [1, N={n}]; got {needed}.")
    return min(r for r in buckets(n) if r >= needed)


class Packed(NamedTuple):
    """A packed batch: tokens, segment, offset [B,R,T] int32 (segment -1 and token 0 on
    unused slots) and slot [B,N,T] int32, the flat R*T slot of each completion token
    (R*T where it lies past the span)."""

    tokens: jax.Array
    segment: jax.Array
    offset: jax.Array
    slot: jax.Array


def pack(tokens, p: Plan, rows: int) -> Packed:
    """Lays tokens [B,N,T] out in [B,rows,T] as `p` says."""
    B, N, T = tokens.shape
    t = jnp.arange(T, dtype=jnp.int32)
    inside = (t < p.length[..., None]) & p.fits[..., None]
    slot = jnp.where(inside, p.row[..., None] * T + p.start[..., None] + t, rows * T)
    b = jnp.arange(B)[:, None]
    flat = slot.reshape(B, N * T)

    def scatter(values, fill):
        out = jnp.full((B, rows * T), fill, jnp.int32)
        out = out.at[b, flat].set(values.reshape(B, N * T).astype(jnp.int32), mode="drop")
        return out.reshape(B, rows, T)

    n = jnp.broadcast_to(jnp.arange(N, dtype=jnp.int32)[:, None], (B, N, T))
    return Packed(scatter(tokens, 0), scatter(n, -1), scatter(jnp.broadcast_to(t, (B, N, T)), 0),
                  slot)  # fmt: skip


def unpack(x, packed: Packed, p: Plan):
    """x [B,R,T] per slot -> [B,N,T] per completion token: 0 past each span, NaN for a
    completion that did not fit."""
    B, R, T = x.shape
    N = p.row.shape[1]
    flat = jnp.minimum(packed.slot, R * T - 1).reshape(B, N * T)
    out = jnp.take_along_axis(x.reshape(B, R * T), flat, axis=1).reshape(B, N, T)
    out = jnp.where(packed.slot < R * T, out, 0.0)
    return jnp.where(p.fits[..., None], out, jnp.nan)


def packed_hidden(params, config: LlamaConfig, prompts, prompt_mask, packed: Packed, *,
                  dtype=jnp.float32, remat: bool = False):  # fmt: skip
    """Final hidden states [B,R,T,D] (before the final norm) of the positions predicting
    each packed slot's token: the prompt's last real token for a segment's offset 0, else
    the slot before it. forward.shared_prompt_hidden with packed completion rows: slot
    positions prompt length + offset, own attention causal within a segment."""
    B, R, T = packed.tokens.shape
    S = prompts.shape[1]
    pmask = prompt_mask.astype(bool)
    p_pos = llama.default_positions(pmask)  # [B,S]
    c_pos = jnp.sum(pmask, axis=-1, dtype=jnp.int32)[:, None, None] + packed.offset
    positions = jnp.concatenate([p_pos, c_pos.reshape(B, R * T)], axis=1)
    cos, sin = llama.rope_tables(config, positions)  # [B, S + R*T, E]
    ids = jnp.concatenate([prompts, packed.tokens.reshape(B, R * T)], axis=1).astype(jnp.int32)
    p_self = jnp.tril(jnp.ones((S, S), bool))[None] & pmask[:, None, :]  # [B,S,S]
    c_prompt = jnp.broadcast_to(pmask[:, None, :], (B, R * T, S))
    seg = packed.segment.reshape(B * R, T)
    # Block-diagonal causal: a slot sees earlier slots of its own segment only (unused
    # slots, segment -1, see each other: finite, and read by nothing real).
    c_self = jnp.tril(jnp.ones((T, T), bool))[None] & (seg[:, :, None] == seg[:, None, :])
    q_c = positions[:, S:]  # [B, R*T]
    own = c_pos.reshape(B * R, T)
    masks = forward.GroupMasks(p_self, p_pos, c_prompt, q_c, c_self, own)

    axes = forward._layer_axes(config)
    seq = dict(gather=sharding.gather_sequence, scatter=sharding.scatter_sequence)  # as padded

    def block(x, inputs):
        layer, w = inputs
        layer = sharding.gather_over_fsdp(layer, axes)  # weights gathered, as the padded path
        q, k, v = llama.layer_qkv(layer, config, x, cos, sin, gather=seq["gather"])
        out = forward.prompt_then_blocks_attention(q, k, v, S, T, w, masks)
        return sharding.constrain_residual(llama.layer_out(layer, config, x, out, **seq)), None

    xs = (params["layers"], llama.layer_windows(config))
    x0 = sharding.constrain_residual(llama.embed(params, ids, dtype))
    x = llama.scan_layers(block, x0, xs, remat=remat)
    D = x.shape[-1]
    xp, xc = x[:, :S], x[:, S:].reshape(B, R, T, D)
    last = jnp.take_along_axis(xp, forward._last_real(pmask)[:, None, None], axis=1)  # [B,1,D]
    before = jnp.concatenate([jnp.zeros_like(xc[:, :, :1]), xc[:, :, :-1]], axis=2)
    return jnp.where((packed.offset == 0)[..., None], last[:, None], before)


def packed_logprobs(
    params,
    config: LlamaConfig,
    prompts,
    prompt_mask,
    tokens,
    mask,
    *,
    rows: int,
    dtype=jnp.float32,
    with_entropy: bool = False,
    chunk_rows: int | None = None,
    chunk_vocab: int | None = None,
    remat: bool = False,
    temperature: float = 1.0,
) -> forward.TokenStats:
    """forward.completion_logprobs on the real tokens only: TokenStats [B,N,T] equal to the
    shared-prompt path's wherever mask [B,N,T] is True (up to float rounding), 0 past each
    completion's span, NaN for a completion that did not fit in `rows` rows.

    prompts, prompt_mask [B,S]; tokens, mask [B,N,T]; rows: static R in [1, N], at least
    rows_needed(mask) (bucket() rounds it to a bounded set). The head runs on the B*R*T
    packed slots instead of B*N*T; other arguments are completion_logprobs'.
    """
    B, N, T = tokens.shape
    if mask.shape != tokens.shape or not 1 <= rows <= N:
        raise ValueError(
            f"packed_logprobs: mask {mask.shape} must be tokens' [B,N,T] {tokens.shape} and "
            f"rows in [1, N={N}]; got rows={rows}."
        )
    p = plan(mask.astype(bool), rows)
    packed = pack(tokens, p, rows)
    hidden = packed_hidden(params, config, prompts, prompt_mask, packed, dtype=dtype,
                           remat=remat)  # fmt: skip
    stats = forward.chunked_token_stats(params, config, hidden, packed.tokens,
                                        with_entropy=with_entropy, chunk_rows=chunk_rows,
                                        chunk_vocab=chunk_vocab,
                                        temperature=temperature)  # fmt: skip
    return forward.TokenStats(
        unpack(stats.logprobs, packed, p),
        None if stats.entropy is None else unpack(stats.entropy, packed, p),
    )


class PackedStep:
    """The jitted update of kjax.rl.train_step with rl.pack=GROUP: per call, sizes the
    packed rows R from the batch's mask (one scalar read back) and runs the update compiled
    for that R (at most len(buckets(N)) compilations). Called with traced arrays (under
    vmap, as the seeds runner does) or lowered from shapes alone, R = N: still exact."""

    def __init__(self, jitted):
        self.jitted = jitted

    @staticmethod
    def rows_of(batch) -> int:
        n = batch.tokens.shape[1]
        if isinstance(batch.mask, (jax.core.Tracer, jax.ShapeDtypeStruct)):
            return n
        return bucket(int(rows_needed(batch.mask)), n)

    def __call__(self, state, batch, ref_params, k):
        return self.jitted(state, batch, ref_params, k, self.rows_of(batch))

    def row_counts(self, batch) -> tuple[int, ...]:
        """Every row count a batch of this shape may be packed into: the step's shapes."""
        return buckets(batch.tokens.shape[1])

    def precompile(self, state, batch, ref_params, k) -> int:
        """Compiles the update for every one of row_counts(batch) now (jit's cache keeps
        them), so that no later step of this batch shape stops to compile; returns how
        many. Arguments as __call__'s (arrays or ShapeDtypeStructs); nothing is run."""
        counts = self.row_counts(batch)
        for rows in counts:
            self.jitted.lower(state, batch, ref_params, k, rows).compile()
        return len(counts)

    def lower(self, state, batch, ref_params, k, rows: int | None = None):
        return self.jitted.lower(state, batch, ref_params, k, rows or batch.tokens.shape[1])
