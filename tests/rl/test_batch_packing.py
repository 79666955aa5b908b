"""rl.pack=BATCH (kjax.rl.batch_packing): the plan against enumeration (every real token
placed once, a row holds only its group's completions, a shard's rows are the sum of its
groups'), the row count of a step against a loop over its microbatches and shards, and
the packed loss and gradients against the padded ones for every objective path of
tests/rl/test_packing.py (PG, PPO token and sequence ratios, TIS, dual clip, off-policy
max@k, policy lag EXACT and TIS, KL and entropy) on a 2-device mesh (2 shards). The slow
tier has every case through loss_fn on one device and the whole sharded PPO step; the
default tier's bench_padding smoke runs a batch-packed step on 8 shards against the padded
one (loss and gradient norm)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from kjax.rl import batch_packing, forward, packing
from kjax.rl.config import LagCorrection, OffPolicyMaxAtK, PackMode, PolicyLoss, StepConfig
from kjax.rl.objective import offpolicy_reweighter
from kjax.rl.train_step import (
    init_train_state,
    loss_fn,
    loss_of_logprobs,
    make_train_step,
    shardings_of,
)
from tests.rl.rl_helpers import CONFIG, mesh, random_batch, tiny_params
from tests.rl.test_forward import _params as o1_params  # O(1) logits: log-probs vary
from tests.rl.test_packing import LOSSES, _assert_trees_close


def _masks(seed, B=6, N=4, T=10):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, T + 1, (B, N))
    lengths[0] = T  # a group needing all N rows
    lengths[1] = 0  # a group with no real token: no rows
    lengths[2, :2] = 0  # zero-length completions inside a group
    lengths[3, 1] = 5
    mask = np.arange(T) < lengths[..., None]
    mask[3, 1, 0] = False  # a hole: the span still runs to the last True
    return mask, lengths


def _ffd_rows(spans, T):
    """First-fit decreasing by hand: the rows one group's spans need."""
    fill = []
    for s in sorted((s for s in spans if s), reverse=True):
        room = [i for i, f in enumerate(fill) if f + s <= T]
        if room:
            fill[room[0]] += s
        else:
            fill.append(s)
    return len(fill)


@functools.partial(jax.jit, static_argnums=(2, 3))  # one program, not op by op
def _plan_and_pack(mask, tokens, shards, rows):
    B, N, T = mask.shape
    bp = batch_packing.plan(mask, shards, rows)
    return bp, packing.pack(tokens.reshape(shards, B // shards * N, T), bp.plan, rows)


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_plan_places_each_token_once_in_its_groups_rows(shards):
    mask, lengths = _masks(shards)
    B, N, T = mask.shape
    G = B // shards
    used = np.asarray(batch_packing.group_rows(jnp.asarray(mask)))
    np.testing.assert_array_equal(used, [_ffd_rows(lengths[b], T) for b in range(B)])
    assert used[0] == N and used[1] == 0
    needed = batch_packing.shard_rows(used, 1, shards)
    assert needed == max(used.reshape(shards, G).sum(1))  # the sum of the shard's groups
    rows = batch_packing.bucket(needed, G * N)
    tokens = np.random.default_rng(shards).integers(1, 99, (B, N, T))
    bp, packed = _plan_and_pack(jnp.asarray(mask), jnp.asarray(tokens), shards, rows)
    p, row_group = bp.plan, np.asarray(bp.row_group)
    assert bool(jnp.all(p.fits))
    got_tok, got_seg, got_off = (np.asarray(a).reshape(shards, -1) for a in packed[:3])
    slot = np.asarray(packed.slot).reshape(shards, G, N, T)
    for s in range(shards):
        owner = np.full(rows, -1)  # the group whose completions fill each row
        taken = []
        for g in range(G):
            b = s * G + g
            for n in range(N):
                for t in range(T):
                    if t >= lengths[b, n]:  # past the span: nowhere
                        assert slot[s, g, n, t] == rows * T
                        continue
                    k = slot[s, g, n, t]
                    assert k % T == p.start[s, g * N + n] + t  # in order within one row
                    assert (got_tok[s, k], got_seg[s, k], got_off[s, k]) == (
                        tokens[b, n, t], g * N + n, t)  # fmt: skip
                    assert owner[k // T] in (-1, g)  # one group per row
                    owner[k // T] = g
                    taken.append(k)
            mine = np.nonzero(owner == g)[0]
            assert len(mine) == used[b]  # the rows the group's own plan needs
            assert (row_group[s, mine] == g).all()  # the row attends its group's prompt
        assert len(set(taken)) == len(taken) == lengths[s * G : (s + 1) * G].sum()
        # The groups' rows end to end from row 0: the shard uses the sum of its groups'.
        assert (owner[: used[s * G : (s + 1) * G].sum()] >= 0).all()
        assert (owner[used[s * G : (s + 1) * G].sum() :] == -1).all()
        assert (np.diff(owner[owner >= 0]) >= 0).all()
        free = np.setdiff1d(np.arange(rows * T), taken)
        assert (got_seg[s, free] == -1).all() and (got_tok[s, free] == 0).all()
    # Too few rows: the completions that do not fit are flagged (their log-probs NaN).
    short = _plan_and_pack(jnp.asarray(mask), jnp.asarray(tokens), shards, 1)[0].plan
    assert not bool(jnp.all(short.fits))


def test_step_rows_are_the_fullest_shard_of_any_microbatch():
    used = np.random.default_rng(0).integers(0, 5, 24)
    for chunks, shards in [(1, 1), (2, 1), (3, 2), (2, 4), (4, 4)]:  # (4, 4): 6 % 4, one shard
        # kjax.rl.train_step._split: minibatch m holds groups m, m + M, ...; its microbatch
        # q, of its groups q, q + Q, ...: chunk q*M + m holds c, c + chunks, ... in order.
        micro = 24 // chunks
        P_ = shards if micro % shards == 0 else 1
        want = max(
            used[c::chunks][p * micro // P_ : (p + 1) * micro // P_].sum()
            for c in range(chunks)
            for p in range(P_)
        )
        assert batch_packing.shard_rows(used, chunks, shards) == max(want, 1)
    assert batch_packing.shard_rows(np.zeros(4, int), 1, 1) == 1
    assert batch_packing.buckets(32) == (4, 8, 12, 16, 20, 24, 28, 32)
    assert batch_packing.buckets(3) == (1, 2, 3) and batch_packing.bucket(17, 32) == 20
    with pytest.raises(ValueError, match="needed"):
        batch_packing.bucket(33, 32)
    with pytest.raises(ValueError, match="chunks"):
        batch_packing.shard_rows(used, 5, 1)


def _uneven_batch(T=8):
    """4 groups of 4 whose plans need 4, 1, 3 and 2 rows (GROUP packs every one in 4)."""
    lengths = np.array([[8, 8, 8, 8], [1, 2, 1, 3], [8, 5, 3, 2], [4, 4, 6, 1]])
    batch = random_batch(B=4, N=4, S=5, T=T, seed=5)
    return batch._replace(mask=jnp.asarray(np.arange(T) < lengths[..., None]))


def _near(logp, mask):
    """The sampler's, old and reference log-probs: the policy's own, each token moved by
    N(0, 0.15^2) (ratios on both sides of PPO's clip, per token and per sequence)."""
    rng = np.random.default_rng(7)
    return [jnp.where(mask, logp + 0.15 * rng.standard_normal(logp.shape), 0.0).astype(
        jnp.float32) for _ in range(3)]  # fmt: skip


@functools.cache
def _two_shards():
    """The batch on a 2-device mesh, its BATCH rows (5 of 8 per shard), and one compiled
    function: (log-probs, entropies) [B,N,T] batch-packed and padded, and the parameter
    gradients of each path for given cotangents of its log-probs and entropies."""
    batch = _uneven_batch()
    m = mesh(2)
    rows = batch_packing.bucket(batch_packing.shard_rows(
        batch_packing.group_rows(batch.mask), 1, 2), 8)  # fmt: skip
    on_batch = NamedSharding(m, P("data"))
    sharded = jax.device_put(batch, on_batch)

    def stats(params, b, packed):
        if packed:
            st = batch_packing.packed_logprobs(params, CONFIG, *b[:4], rows=rows,
                                               with_entropy=True)  # fmt: skip
        else:
            st = forward.completion_logprobs(params, CONFIG, *b[:3], with_entropy=True)
        return tuple(jnp.where(b.mask, a, 0.0) for a in st)

    @jax.jit
    def pair(params, b, cotangents):
        with jax.sharding.use_abstract_mesh(m.abstract_mesh):
            out = []
            for packed, ct in zip((True, False), cotangents, strict=True):
                st, vjp = jax.vjp(lambda p, packed=packed: stats(p, b, packed), params)
                out.append((st, vjp(ct)[0]))
            return out

    def call(params, cotangents):  # cotangents laid out as the batch: one compilation
        return pair(params, sharded, jax.device_put(cotangents, on_batch))

    return sharded, rows, call


@pytest.mark.parametrize("name", list(LOSSES))
def test_batch_packed_loss_and_gradients_equal_padded_on_two_shards(name):
    """loss_fn's loss and gradient, by the chain rule: the objective's gradient in the
    log-probs and entropies (loss_of_logprobs) pulled back through each forward, one
    compiled pair of forwards for every objective."""
    cfg, objective, first = LOSSES[name]
    batch, rows, pair = _two_shards()
    assert rows == 5  # shard 0: groups needing 4 + 1 rows, shard 1: 3 + 2
    reweight = offpolicy_reweighter(objective, cfg, (2,)) if objective else None
    params = o1_params(CONFIG, 0)
    zeros = (jnp.zeros(batch.tokens.shape),) * 2
    (st, _), (st_ref, _) = pair(params, cotangents=(zeros, zeros))
    sampler, old, ref = _near(st_ref[0], batch.mask)
    batch = batch._replace(sampler_logprobs=sampler)
    np.testing.assert_allclose(st[0], st_ref[0], atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(st[1], st_ref[1], atol=1e-6, rtol=1e-6)
    assert float(jnp.std(st_ref[0])) > 0.1

    @jax.jit
    def objective_grad(lp, ent):
        f = functools.partial(loss_of_logprobs, batch=batch, cfg=cfg, old_logprobs=old,
                              ref_logprobs=ref, k=2, first=first, reweight=reweight)  # fmt: skip
        return jax.value_and_grad(lambda a, e: f(a, entropy=e), (0, 1), has_aux=True)(lp, ent)

    (loss, metrics), ct = objective_grad(*st)
    (loss_ref, metrics_ref), ct_ref = objective_grad(*st_ref)
    (_, grads), (_, grads_ref) = pair(params, cotangents=(ct, ct_ref))
    assert abs(float(loss_ref)) > 1e-3
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-5, atol=1e-7)
    for key in metrics_ref:
        np.testing.assert_allclose(metrics[key], metrics_ref[key], rtol=1e-5, atol=1e-6)
    _assert_trees_close(grads, grads_ref)


def _loss_fn_pair(name):
    cfg, objective, first = LOSSES[name]
    batch = _uneven_batch()
    logp = jax.jit(forward.completion_logprobs, static_argnums=1)(
        o1_params(CONFIG, 0), CONFIG, *batch[:3]).logprobs  # fmt: skip
    sampler, old, ref = _near(logp, batch.mask)
    batch = batch._replace(sampler_logprobs=sampler)
    rows = batch_packing.bucket(batch_packing.shard_rows(
        batch_packing.group_rows(batch.mask), 1, 1), 16)  # fmt: skip
    assert rows == 10  # 4 + 1 + 3 + 2 rows of one shard's 16 (GROUP: 4 per group, 16)
    reweight = offpolicy_reweighter(objective, cfg, (2,)) if objective else None
    batch_cfg = dataclasses.replace(cfg, pack=PackMode.BATCH)

    def value_and_grad(params, c, pack_rows):
        f = functools.partial(loss_fn, cfg=c, model_config=CONFIG, old_logprobs=old,
                              ref_logprobs=ref, k=2, first=first, reweight=reweight,
                              pack_rows=pack_rows)  # fmt: skip
        return jax.value_and_grad(lambda p: f(p, batch), has_aux=True)(params)

    both = jax.jit(lambda p: [value_and_grad(p, batch_cfg, rows), value_and_grad(p, cfg, None)])
    ((loss, metrics), grads), ((loss_ref, metrics_ref), grads_ref) = both(o1_params(CONFIG, 0))
    assert abs(float(loss_ref)) > 1e-3
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-5, atol=1e-7)
    for key in metrics_ref:
        np.testing.assert_allclose(metrics[key], metrics_ref[key], rtol=1e-5, atol=1e-6)
    _assert_trees_close(grads, grads_ref)


@pytest.mark.slow  # ~11-22 s each under load (a compile each); the chain-rule test above
@pytest.mark.parametrize("name", list(LOSSES))  # is the default tier's, on two shards
def test_loss_fn_with_batch_packing_equals_padded_on_one_device(name):
    """rl.pack=BATCH through loss_fn itself, one shard (the CPU benchmark's layout)."""
    _loss_fn_pair(name)


@pytest.mark.slow  # ~30-50 s each under load, as test_packing's GROUP step
@pytest.mark.parametrize("minibatches, microbatches", [(2, 1), (2, 2)])
def test_batch_packed_ppo_step_equals_padded_step_on_a_mesh(minibatches, microbatches):
    """Epochs x minibatches (x microbatches) on a 2-device mesh, old and reference
    log-probs batch-packed too: the same parameters after the step. (2, 1): each
    minibatch's 2 groups on 2 shards; (2, 2): a microbatch of 1 group, which 2 shards do
    not divide, packed as one shard (layout_shards)."""
    cfg = StepConfig(loss=PolicyLoss.PPO, epochs=2, minibatches=minibatches,
                     microbatches=microbatches, kl_coef=0.1, entropy_coef=0.05,
                     lag_correction=LagCorrection.NONE,
                     offpolicy_max_at_k=OffPolicyMaxAtK.OFF)  # fmt: skip
    batch = _uneven_batch()
    m, opt = mesh(2), optax.sgd(0.05)
    out = {}
    for mode in (PackMode.OFF, PackMode.BATCH):
        state = init_train_state(tiny_params(), opt, jax.random.key(0), m)
        step = make_train_step(CONFIG, dataclasses.replace(cfg, pack=mode), opt, m,
                               shardings_of(state))  # fmt: skip
        if mode is PackMode.BATCH:
            # Groups need 4, 1, 3, 2 rows. (2, 1): minibatch 0 is groups 0, 2 (4 and 3
            # rows), one per shard; minibatch 1 is 1, 3. (2, 2): one group per microbatch.
            assert isinstance(step, batch_packing.BatchPackedStep)
            assert step.rows_of(batch) == 4 and step.total(batch) == 4
        out[mode] = step(state, batch, tiny_params(1), np.int32(2))
    (new, metrics), (old, metrics_ref) = out[PackMode.BATCH], out[PackMode.OFF]
    assert bool(metrics["finite"])
    np.testing.assert_allclose(metrics["loss"], metrics_ref["loss"], rtol=1e-5, atol=1e-7)
    moved = jax.tree.map(lambda a, b: jnp.max(jnp.abs(a - b)), old.params, tiny_params())
    assert max(jax.tree.leaves(moved)) > 1e-3
    for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(old.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-6)
