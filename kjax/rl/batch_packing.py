"""rl.pack=BATCH: the packed rows counted over the groups of each batch shard, not per group.

kjax.rl.packing (rl.pack=GROUP) packs each group's N completions into R rows of T with
one static R for the whole batch, the fullest group's, so every group pays for the
fullest one's rows. Here each group's completions are packed by the same first-fit
decreasing (packing.plan: group g needs R_g rows), and the rows of the G groups a batch
shard holds are laid end to end: the shard uses sum_g R_g rows. Every row still belongs
to ONE group (`row_group`): its queries attend that group's prompt K/V, gathered per row,
and their own segment causally; the prompt still runs once per group. The static row
count R_s is the largest sum over the shards of any microbatch, rounded up to
`buckets(G*N)` (eighths of G*N: at most 8 compilations).

Why eighths, not GROUP's quarters: SmolLM2 at 4 x 8 x 128 fills about 16-17 of a shard's
32 rows (docs/performance.md); quarters would round 17 up to 24, GROUP's 6 of 8 rows per
group, and gain nothing.

Layout: the batch's B groups (micro)batch [B,...], B over the mesh's batch axes in
contiguous blocks, become P = sharding.batch_shards() shards of G = B/P groups (P = 1 on
one device, or where P does not divide B), each laid out as one sequence of G*S prompt
positions then R_s rows of T ([P, G*S + R_s*T, D]): the P axis is the batch-sharded one,
so each shard's rows live on the devices that hold its groups, and every projection and
MLP matmul is one matmul over prompts and rows. Attention is the jnp reference, as
GROUP's (the packing module docstring says why). Log-probs, entropies and gradients equal
the padded path's to float rounding (tests/rl/test_batch_packing.py).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kjax import sharding
from kjax.models import llama
from kjax.models.config import LlamaConfig
from kjax.rl import forward, packing

PARTS = 8  # buckets: eighths of a shard's G*N rows


class BatchPlan(NamedTuple):
    """Where each completion of a [B,N,T] batch sits in [P,R,T] packed rows.

    plan: a packing.Plan over [P, G*N] completions and [P,R] rows (row, start, length,
      fits [P,G*N]; fill [P,R]): completion n of the shard's group g is completion g*N + n.
    row_group: [P,R] int32, the group (0..G-1 within its shard) each row belongs to (rows
      past the shard's sum: the last group, holding nothing).
    used: [B] int32 rows each group needs (0 for a group without a real token).
    """

    plan: packing.Plan
    row_group: jax.Array
    used: jax.Array


def layout_shards(groups: int, shards: int) -> int:
    """How many shards P a (micro)batch of `groups` groups is packed as: the mesh's batch
    shards where they divide it, else 1 (one layout, left to the partitioner)."""
    return shards if shards >= 1 and groups % shards == 0 else 1


def group_plan(mask) -> tuple[packing.Plan, jax.Array]:
    """(packing.plan of mask [B,N,T] into N rows, rows used [B] int32): each group's own
    first-fit decreasing, whose rows are a prefix of its N (the same for any row count at
    least what it needs)."""
    p = packing.plan(mask, mask.shape[1])
    return p, jnp.sum(p.fill > 0, axis=1).astype(jnp.int32)


@jax.jit
def group_rows(mask) -> jax.Array:
    """[B] int32: the rows each group of mask [B,N,T] needs under packing.plan (0 if none)."""
    return group_plan(mask.astype(bool))[1]


def plan(mask, shards: int, rows: int) -> BatchPlan:
    """Each group's plan (group_plan) with its rows placed after the rows of the groups
    before it in its shard. mask: [B,N,T] bool; shards: P dividing B; rows: static R >= 1.
    A completion whose row falls at or past R does not fit (fits False)."""
    B, N, T = mask.shape
    G = B // shards
    p, used = group_plan(mask)
    end = jnp.cumsum(used.reshape(shards, G), axis=1)  # [P,G] rows up to each group's end
    first = end - used.reshape(shards, G)
    row = (first[..., None] + p.row.reshape(shards, G, N)).reshape(shards, G * N)
    length = p.length.reshape(shards, G * N)
    fits = (row < rows) | (length == 0)
    r = jnp.arange(rows, dtype=jnp.int32)
    row_group = jnp.minimum(jnp.sum(end[:, None, :] <= r[None, :, None], axis=2), G - 1)
    shard = jnp.arange(shards)[:, None]
    fill = jnp.zeros((shards, rows), jnp.int32).at[shard, row].add(length, mode="drop")
    start = p.start.reshape(shards, G * N)
    plan_ = packing.Plan(row, start, length, fill, fits)
    return BatchPlan(plan_, row_group.astype(jnp.int32), used)


def shard_rows(used, chunks: int, shards: int) -> int:
    """The most rows any shard of any of the `chunks` microbatches needs (>= 1), from the
    rows each group needs, used [B] (group_rows). A chunk is the groups c, c + chunks,
    c + 2 chunks, ... (kjax.rl.train_step._split, minibatches then microbatches), in that
    order, and its shard p the p-th contiguous block of them (the batch axes' layout)."""
    used = np.asarray(used)
    B = used.shape[0]
    if B % chunks:
        raise ValueError(f"shard_rows: B={B} groups must divide into {chunks} chunks.")
    micro = B // chunks
    P = layout_shards(micro, shards)
    per_shard = used.reshape(micro, chunks).T.reshape(chunks, P, micro // P).sum(axis=-1)
    return max(int(per_shard.max()), 1)


def buckets(total: int, parts: int = PARTS) -> tuple[int, ...]:
    """The row counts R a shard of `total` = G*N completions may be packed into: total
    * q / parts for q = 1..parts, rounded up (a bounded set: one compilation each)."""
    return tuple(sorted({max(1, math.ceil(total * q / parts)) for q in range(1, parts + 1)}))


def bucket(needed: int, total: int, parts: int = PARTS) -> int:
    """The smallest of buckets(total, parts) >= needed rows."""
    if not 1 <= needed <= total:
        raise ValueError(f"`needed` rows must be in [1, G*N={total}]; got {needed}.")
    return min(r for r in buckets(total, parts) if r >= needed)


class RowMasks(NamedTuple):
    """The masks of the batch-packed layout (P shards of G prompts of S then R rows of T):
    p_self [P*G,S,S], p_pos [P*G,S] (the prompts'); c_prompt [P*R,1,S] and k_pos [P*R,S]
    (each row's group's prompt), q_pos [P*R,T] (the rows' positions), c_self [P*R,T,T]
    (causal within a segment)."""

    p_self: jax.Array
    p_pos: jax.Array
    c_prompt: jax.Array
    k_pos: jax.Array
    q_pos: jax.Array
    c_self: jax.Array


def _rows_of_groups(x, row_group):
    """x [P,G,...] -> [P,R,...]: each row's group's entry."""
    idx = row_group.reshape(*row_group.shape, *([1] * (x.ndim - 2)))
    return jnp.take_along_axis(x, idx, axis=1)


def rows_attention(q, k, v, S: int, T: int, row_group, window, m: RowMasks):
    """Attention [P, G*S + R*T, H, E] of q, k, v in the batch-packed layout: the prompts
    causally, each row's queries over its group's prompt K/V (gathered per row) and over
    its own row (causal within a segment), the two merged by log-sum-exp."""
    P, L, H, E = q.shape
    R = row_group.shape[1]
    G = (L - R * T) // S
    qp, kp, vp = (a[:, : G * S].reshape(P * G, S, -1, E) for a in (q, k, v))
    qc, kc, vc = (a[:, G * S :].reshape(P * R, T, -1, E) for a in (q, k, v))
    out_p = llama.attention(qp, kp, vp, llama.windowed(m.p_self, window, m.p_pos, m.p_pos))

    def per_row(a):  # [P*G, S, K, E] -> [P*R, S, K, E]: each row's group's prompt
        return _rows_of_groups(a.reshape(P, G, *a.shape[1:]), row_group).reshape(P * R, S, -1, E)

    c_p = llama.windowed(m.c_prompt, window, m.q_pos, m.k_pos)
    o1, l1 = llama.attention(qc, per_row(kp), per_row(vp), c_p, with_lse=True)
    own = llama.windowed(m.c_self, window, m.q_pos, m.q_pos)
    o2, l2 = llama.attention(qc, kc, vc, own, with_lse=True)
    out_c = llama.merge_attention([(o1, l1), (o2, l2)])
    return jnp.concatenate([out_p.reshape(P, G * S, H, E), out_c.reshape(P, R * T, H, E)], 1)


def packed_hidden(params, config: LlamaConfig, prompts, prompt_mask, packed: packing.Packed,
                  row_group, *, dtype=jnp.float32, remat: bool = False):  # fmt: skip
    """Final hidden states [P,R,T,D] (before the final norm) of the positions predicting
    each packed slot's token (packing.packed_hidden with rows counted per shard): the
    group's last real prompt token for a segment's offset 0, else the slot before it.
    prompts, prompt_mask [B,S], B = P*G; packed [P,R,T]; row_group [P,R]."""
    P, R, T = packed.tokens.shape
    B, S = prompts.shape
    G = B // P
    pmask = prompt_mask.astype(bool)
    p_pos = llama.default_positions(pmask)  # [B,S]
    plen = jnp.sum(pmask, axis=-1, dtype=jnp.int32).reshape(P, G)
    c_pos = _rows_of_groups(plen, row_group)[..., None] + packed.offset  # [P,R,T]
    positions = jnp.concatenate([p_pos.reshape(P, G * S), c_pos.reshape(P, R * T)], axis=1)
    cos, sin = llama.rope_tables(config, positions)  # [P, G*S + R*T, E]
    ids = jnp.concatenate([prompts.reshape(P, G * S), packed.tokens.reshape(P, R * T)], axis=1)
    seg = packed.segment.reshape(P * R, T)
    masks = RowMasks(
        p_self=jnp.tril(jnp.ones((S, S), bool))[None] & pmask[:, None, :],
        p_pos=p_pos,
        c_prompt=_rows_of_groups(pmask.reshape(P, G, S), row_group).reshape(P * R, 1, S),
        k_pos=_rows_of_groups(p_pos.reshape(P, G, S), row_group).reshape(P * R, S),
        q_pos=c_pos.reshape(P * R, T),
        # A slot sees earlier slots of its own segment only (unused slots, segment -1, see
        # each other: finite, and read by nothing real).
        c_self=jnp.tril(jnp.ones((T, T), bool))[None] & (seg[:, :, None] == seg[:, None, :]),
    )
    axes = forward._layer_axes(config)
    seq = dict(gather=sharding.gather_sequence, scatter=sharding.scatter_sequence)

    def block(x, inputs):
        layer, w = inputs
        layer = sharding.gather_over_fsdp(layer, axes)  # weights gathered, as the padded path
        q, k, v = llama.layer_qkv(layer, config, x, cos, sin, gather=seq["gather"])
        out = rows_attention(q, k, v, S, T, row_group, w, masks)
        return sharding.constrain_residual(llama.layer_out(layer, config, x, out, **seq)), None

    xs = (params["layers"], llama.layer_windows(config))
    x0 = sharding.constrain_residual(llama.embed(params, ids.astype(jnp.int32), dtype))
    x = llama.scan_layers(block, x0, xs, remat=remat)
    D = x.shape[-1]
    xp, xc = x[:, : G * S].reshape(B, S, D), x[:, G * S :].reshape(P, R, T, D)
    last = jnp.take_along_axis(xp, forward._last_real(pmask)[:, None, None], axis=1)  # [B,1,D]
    last = _rows_of_groups(last.reshape(P, G, D), row_group)  # [P,R,D]
    before = jnp.concatenate([jnp.zeros_like(xc[:, :, :1]), xc[:, :, :-1]], axis=2)
    return jnp.where((packed.offset == 0)[..., None], last[:, :, None], before)


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
    """forward.completion_logprobs on the real tokens only, rows counted per batch shard:
    TokenStats [B,N,T] equal to the shared-prompt path's wherever mask [B,N,T] is True (up
    to float rounding), 0 past each completion's span, NaN for a completion that did not
    fit in `rows` rows.

    rows: static R in [1, G*N], G = B / P groups per shard (P = layout_shards(B,
    sharding.batch_shards())), at least every shard's sum of group_rows (shard_rows;
    bucket() rounds it to a bounded set). Other arguments are packing.packed_logprobs'.
    """
    B, N, T = tokens.shape
    P = layout_shards(B, sharding.batch_shards())
    G = B // P
    if mask.shape != tokens.shape or not 1 <= rows <= G * N:
        raise ValueError(
            f"batch_packing.packed_logprobs: mask {mask.shape} must be tokens' [B,N,T] "
            f"{tokens.shape} and rows in [1, G*N={G * N}] (G={G} groups per shard); got "
            f"rows={rows}."
        )
    bp = plan(mask.astype(bool), P, rows)
    packed = packing.pack(tokens.reshape(P, G * N, T), bp.plan, rows)
    packed = packing.Packed(*(sharding.constrain_batch(a) for a in packed))
    hidden = packed_hidden(params, config, prompts, prompt_mask, packed, bp.row_group,
                           dtype=dtype, remat=remat)  # fmt: skip
    stats = forward.chunked_token_stats(params, config, hidden, packed.tokens,
                                        with_entropy=with_entropy, chunk_rows=chunk_rows,
                                        chunk_vocab=chunk_vocab,
                                        temperature=temperature)  # fmt: skip

    def back(x):  # [P,R,T] per slot -> [B,N,T] per completion token
        return packing.unpack(x, packed, bp.plan).reshape(B, N, T)

    return forward.TokenStats(
        back(stats.logprobs), None if stats.entropy is None else back(stats.entropy)
    )


class BatchPackedStep(packing.PackedStep):
    """The jitted update of kjax.rl.train_step with rl.pack=BATCH: per call, sizes the
    packed rows per shard from the batch's mask (rows per group read back, [B] int32) and
    runs the update compiled for that count (at most len(buckets(G*N)) compilations).
    chunks: minibatches * microbatches; shards: the mesh's batch shards. Traced or
    abstract batches get the full G*N: still exact."""

    def __init__(self, jitted, chunks: int, shards: int):
        super().__init__(jitted)
        self.chunks, self.shards = chunks, shards

    def total(self, batch) -> int:
        """G*N: the completions of one shard of one microbatch."""
        B, N = batch.tokens.shape[:2]
        micro = B // self.chunks
        return micro // layout_shards(micro, self.shards) * N

    def rows_of(self, batch) -> int:
        total = self.total(batch)
        if isinstance(batch.mask, (jax.core.Tracer, jax.ShapeDtypeStruct)):
            return total
        needed = shard_rows(group_rows(batch.mask), self.chunks, self.shards)
        return bucket(needed, total)

    def row_counts(self, batch) -> tuple[int, ...]:
        return buckets(self.total(batch))

    def lower(self, state, batch, ref_params, k, rows: int | None = None):
        return self.jitted.lower(state, batch, ref_params, k, rows or self.total(batch))
