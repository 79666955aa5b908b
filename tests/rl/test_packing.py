"""rl.pack=GROUP: the packing plan (every real token placed once, spans never overlap,
offsets right), and the packed update against the padded one: log-probs, entropies,
losses and gradients equal to float rounding for PG, PPO (token and sequence ratios, TIS,
dual clip), off-policy max@k, policy lag EXACT and TIS, with KL and entropy terms, and a
whole PPO step (epochs x minibatches) on a 2-device mesh."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from kjax.models import Family
from kjax.rl import forward, packing
from kjax.rl.config import (
    LagCorrection,
    LossAggregation,
    Objective,
    ObjectiveConfig,
    OffPolicyMaxAtK,
    PackMode,
    PolicyLoss,
    RatioLevel,
    StepConfig,
)
from kjax.rl.objective import offpolicy_reweighter
from kjax.rl.train_step import init_train_state, loss_fn, make_train_step, shardings_of
from tests.rl.rl_helpers import CONFIG, mesh, random_batch, tiny_params
from tests.rl.test_forward import _params as o1_params  # O(1) logits: log-probs vary


def _masks(seed, B=5, N=8, T=10):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, T + 1, (B, N))
    lengths[0] = T  # a group with nothing to pack
    mask = np.arange(T) < lengths[..., None]
    mask[1, 2, 1] = False  # a hole: the span still runs to the last True
    return mask, lengths


@pytest.mark.parametrize("seed", [0, 1])
def test_plan_places_every_real_token_once_at_its_position(seed):
    mask, lengths = _masks(seed)
    B, N, T = mask.shape
    needed = int(packing.rows_needed(jnp.asarray(mask)))
    rows = packing.bucket(needed, N)
    assert rows in packing.buckets(N) and needed <= rows
    p = packing.plan(jnp.asarray(mask), rows)
    np.testing.assert_array_equal(p.length, lengths)  # the hole keeps its span
    assert bool(jnp.all(p.fits))
    # Same placement whatever the spare rows: what lets the host size R from rows=N.
    full = packing.plan(jnp.asarray(mask), N)
    np.testing.assert_array_equal(p.row, full.row)
    np.testing.assert_array_equal(p.start, full.start)
    # No group fits in fewer rows than its tokens need; the full group needs all N.
    assert needed >= max(-(-lengths.sum(1) // T))
    assert int(jnp.sum(p.fill[0] > 0)) == N

    tokens = np.random.default_rng(seed).integers(1, 99, (B, N, T))
    packed = packing.pack(jnp.asarray(tokens), p, rows)
    got_tok, got_seg, got_off = (np.asarray(a).reshape(B, -1) for a in packed[:3])
    slot = np.asarray(packed.slot)
    for b in range(B):
        used = []
        for n in range(N):
            for t in range(lengths[b, n]):
                s = slot[b, n, t]
                assert s // T == p.row[b, n] and s % T == p.start[b, n] + t  # one row, in order
                assert (got_tok[b, s], got_seg[b, s], got_off[b, s]) == (tokens[b, n, t], n, t)
                used.append(s)
            assert (slot[b, n, lengths[b, n] :] == rows * T).all()  # past the span: nowhere
        assert len(set(used)) == len(used) == lengths[b].sum()  # each slot holds one token
        free = np.setdiff1d(np.arange(rows * T), used)
        assert (got_seg[b, free] == -1).all() and (got_tok[b, free] == 0).all()

    # Unpacking reads each token's slot back, 0 past the span; too few rows give NaN.
    x = np.random.default_rng(9).standard_normal((B, rows, T)).astype(np.float32)
    back = np.asarray(packing.unpack(jnp.asarray(x), packed, p))
    inside = slot < rows * T
    np.testing.assert_array_equal(
        back[inside], x.reshape(B, -1)[np.nonzero(inside)[0], slot[inside]]
    )
    assert (back[~inside] == 0).all()
    x = jnp.asarray(x)
    short = packing.plan(jnp.asarray(mask), 1)
    assert not bool(jnp.all(short.fits))
    bad = np.asarray(packing.unpack(x[:, :1], packing.pack(jnp.asarray(tokens), short, 1), short))
    assert np.isnan(bad[~np.asarray(short.fits)]).all()
    assert not np.isnan(bad[np.asarray(short.fits)]).any()


def test_buckets_are_bounded_and_refuse_bad_counts():
    assert packing.buckets(8) == (2, 4, 6, 8) and packing.buckets(1) == (1,)
    assert packing.bucket(3, 8) == 4 and packing.bucket(1, 3) == 1
    with pytest.raises(ValueError, match="needed"):
        packing.bucket(9, 8)


@pytest.mark.slow  # ~12 s; the default tier's packed tests use the plain config
def test_packed_forward_equals_padded_with_a_sliding_window():
    """Qwen3 q/k norms, GQA, a 2-position window on layer 1, left-padded prompts."""
    config = dataclasses.replace(
        CONFIG, family=Family.QWEN3, sliding_window=2, sliding_layers=(False, True)
    )
    batch = random_batch(B=3, N=4, S=5, T=6, seed=3)
    params = o1_params(config, seed=1)
    weights = jax.random.normal(jax.random.key(2), batch.tokens.shape)
    rows = packing.bucket(int(packing.rows_needed(batch.mask)), 4)
    assert rows < 4  # the test packs something

    def objective(p, packed):
        kw = dict(with_entropy=True, chunk_rows=5)
        if packed:
            st = packing.packed_logprobs(p, config, *batch[:4], rows=rows, **kw)
        else:
            st = forward.completion_logprobs(p, config, *batch[:3], **kw)
        lp, ent = (jnp.where(batch.mask, a, 0.0) for a in st)
        return jnp.sum(weights * lp) + jnp.sum(ent**2), (lp, ent)

    grads = jax.jit(lambda p: [jax.grad(objective, has_aux=True)(p, s) for s in (True, False)])
    (g_new, (lp, ent)), (g_ref, (lp_ref, ent_ref)) = grads(params)
    assert float(jnp.std(lp_ref)) > 0.1
    np.testing.assert_allclose(lp, lp_ref, atol=1e-6, rtol=0)
    np.testing.assert_allclose(ent, ent_ref, atol=1e-6, rtol=0)
    _assert_trees_close(g_new, g_ref)


def _assert_trees_close(got, want, rtol=2e-5):
    for path, a in jax.tree_util.tree_leaves_with_path(got):
        b = _at(want, path)
        scale = float(jnp.max(jnp.abs(b)))
        assert scale > 0, path
        np.testing.assert_allclose(a, b, atol=rtol * scale, rtol=0, err_msg=str(path))


def _at(tree, path):
    for key in path:
        tree = tree[key.key if hasattr(key, "key") else key.idx]
    return tree


MAX2 = ObjectiveConfig(Objective.MAX_AT_K, k=2)
PPO_SEQ = dict(loss=PolicyLoss.PPO, ratio_level=RatioLevel.SEQUENCE, epochs=2)
LOSSES = {  # name -> (StepConfig, objective for the re-weighting or None, first update?)
    "pg_kl_entropy": (StepConfig(kl_coef=0.1, entropy_coef=0.05), None, True),
    "ppo_token_tis_dual": (
        StepConfig(loss=PolicyLoss.PPO, epochs=2, tis_cap=1.5, dual_clip=3.0,
                   aggregation=LossAggregation.SEQ_MEAN_TOKEN_MEAN, kl_coef=0.1),
        None, False,
    ),
    "ppo_seq_offpolicy_exact": (
        StepConfig(**PPO_SEQ, offpolicy_max_at_k=OffPolicyMaxAtK.EXACT,
                   aggregation=LossAggregation.CONSTANT_NORMALIZER, entropy_coef=0.05),
        MAX2, False,
    ),
    "pg_lag_exact": (StepConfig(policy_lag=1, lag_correction=LagCorrection.EXACT), MAX2, True),
    "ppo_seq_lag_exact": (
        StepConfig(**PPO_SEQ, policy_lag=1, lag_correction=LagCorrection.EXACT), MAX2, False,
    ),
    "pg_lag_tis": (
        StepConfig(policy_lag=1, lag_correction=LagCorrection.TIS, tis_cap=1.5, kl_coef=0.1),
        None, True,
    ),
}  # fmt: skip


def _spread_batch(seed, T=8):
    """random_batch with an RL-like length spread: one completion per group hits the cap T,
    the others stop after 1..T/2 tokens (their padding holds nonzero tokens)."""
    batch = random_batch(B=4, N=4, S=5, T=T, seed=seed)
    lengths = np.random.default_rng(seed).integers(1, T // 2 + 1, (4, 4))
    lengths[:, seed % 4] = T
    return batch._replace(mask=jnp.asarray(np.arange(T) < lengths[..., None]))


@functools.cache
def _loss_batch():
    """A batch whose sampler / old / reference log-probs are other policies' (real ratios)."""
    batch = _spread_batch(5)

    @jax.jit
    def logp(params):
        lp = forward.completion_logprobs(params, CONFIG, *batch[:3]).logprobs
        return jnp.where(batch.mask, lp, 0.0)

    lps = [logp(tiny_params(seed)) for seed in (3, 4, 5)]
    return batch._replace(sampler_logprobs=lps[0]), lps[1], lps[2]


# GROUP's two most different cases stay in the default tier; the other four are slow: all
# six run there through BATCH on two shards (tests/rl/test_batch_packing.py), which packs
# each group with this module's first-fit.
_DEFAULT_TIER = ("ppo_token_tis_dual", "pg_lag_exact")


@pytest.mark.parametrize(
    "name",
    [n if n in _DEFAULT_TIER else pytest.param(n, marks=pytest.mark.slow) for n in LOSSES],
)
def test_packed_loss_and_gradients_equal_padded(name):
    cfg, objective, first = LOSSES[name]
    batch, old, ref = _loss_batch()
    rows = packing.bucket(int(packing.rows_needed(batch.mask)), 4)
    assert rows < 4
    reweight = offpolicy_reweighter(objective, cfg, (2,)) if objective else None
    if (
        cfg.lag_correction is LagCorrection.EXACT
        or cfg.offpolicy_max_at_k is not OffPolicyMaxAtK.OFF
    ):
        assert reweight is not None  # fmt: skip

    def value_and_grad(params, pack_rows):
        f = functools.partial(loss_fn, cfg=cfg, model_config=CONFIG, old_logprobs=old,
                              ref_logprobs=ref, k=2, first=first, reweight=reweight,
                              pack_rows=pack_rows)  # fmt: skip
        return jax.value_and_grad(lambda p: f(p, batch), has_aux=True)(params)

    both = jax.jit(lambda p: [value_and_grad(p, r) for r in (rows, None)])
    ((loss, metrics), grads), ((loss_ref, metrics_ref), grads_ref) = both(tiny_params(0))
    assert abs(float(loss_ref)) > 1e-3
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-5, atol=1e-7)
    for key in metrics_ref:
        np.testing.assert_allclose(metrics[key], metrics_ref[key], rtol=1e-5, atol=1e-6)
    _assert_trees_close(grads, grads_ref)


@pytest.mark.slow  # ~20 s; bench_rl_step's smoke (default tier) checks a whole packed update
def test_packed_ppo_step_equals_padded_step():
    """Epochs x minibatches x microbatches on a 2-device mesh, old and reference log-probs
    computed packed too: the same parameters after the step."""
    cfg = StepConfig(loss=PolicyLoss.PPO, epochs=2, minibatches=2, kl_coef=0.1,
                     entropy_coef=0.05)  # fmt: skip
    batch = _spread_batch(7)
    m, opt = mesh(2), optax.sgd(0.05)
    out = {}
    for mode in (PackMode.OFF, PackMode.GROUP):  # BATCH: tests/rl/test_batch_packing.py
        state = init_train_state(tiny_params(), opt, jax.random.key(0), m)
        step = make_train_step(CONFIG, dataclasses.replace(cfg, pack=mode), opt, m,
                               shardings_of(state))  # fmt: skip
        if mode is PackMode.GROUP:
            assert isinstance(step, packing.PackedStep) and step.rows_of(batch) < 4
        out[mode] = step(state, batch, tiny_params(1), np.int32(2))
    (new, metrics), (old, metrics_ref) = out[PackMode.GROUP], out[PackMode.OFF]
    assert bool(metrics["finite"])
    np.testing.assert_allclose(metrics["loss"], metrics_ref["loss"], rtol=1e-5, atol=1e-7)
    # Parameters of O(1) moved by O(1e-3): compared at float32's resolution of the values.
    moved = jax.tree.map(lambda a, b: jnp.max(jnp.abs(a - b)), old.params, tiny_params())
    assert max(jax.tree.leaves(moved)) > 1e-3
    for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(old.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("mode", [PackMode.GROUP, PackMode.BATCH])
def test_precompile_leaves_no_row_count_to_compile_later(mode):
    """PackedStep.precompile compiles the update for every row count a batch of its shape
    can take (row_counts), so no later call compiles (XLA's compile events are counted):
    checked on a stand-in update (the packed steps call any jitted (state, batch, ref, k,
    rows) function; this one is cheap to compile), with batches of every R."""
    from kjax.rl import batch_packing

    compiles = []

    def listen(event, secs, fun_name="", **kw):  # XLA compiles of the stand-in update
        if event == "/jax/core/compile/backend_compile_duration" and "stand_in" in fun_name:
            compiles.append(fun_name)

    jax.monitoring.register_event_duration_secs_listener(listen)

    def stand_in(s, b, ref, k, rows):
        return s + jnp.sum(b.mask[:, :rows] * b.tokens[:, :rows]) + 0.5 * rows, k

    jitted = jax.jit(stand_in, static_argnums=4)
    if mode is PackMode.GROUP:
        step = packing.PackedStep(jitted)
    else:
        step = batch_packing.BatchPackedStep(jitted, 1, 2)
    B, N, T = 4, 4, 6
    batch = random_batch(B=B, N=N, S=3, T=T, seed=0)
    counts = step.row_counts(batch)
    want = packing.buckets(N) if mode is PackMode.GROUP else batch_packing.buckets(B // 2 * N)
    assert counts == want and len(counts) > 1
    state, k = jnp.float32(0), np.int32(1)
    assert step.precompile(state, batch, None, k) == len(counts)
    assert len(compiles) == len(counts)
    before, seen = len(compiles), set()
    for used in range(1, N + 1):  # every group needs `used` rows: R runs over the buckets
        lengths = np.full((B, N), T)
        lengths[:, used:] = 0
        b = batch._replace(mask=jnp.asarray(np.arange(T) < lengths[..., None]))
        rows = step.rows_of(b)
        out, _ = step(state, b, None, k)
        seen.add(rows)
        host = np.asarray(b.mask)[:, :rows] * np.asarray(b.tokens)[:, :rows]
        np.testing.assert_allclose(float(out), host.sum() + 0.5 * rows)  # that R's update
    jax.monitoring.unregister_event_duration_listener(listen)
    assert len(seen) > 1 and len(compiles) == before  # several R, none compiled again
