"""The compacting decode (sample_params' compact_floor) against the static one: same key,
same rollouts, while the live samples really move into smaller batches."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kjax import sampling, sharding
from kjax.models import from_params
from kjax.models.config import Family
from tests.models.hf_reference import kjax_from_hf, random_hf_model

V = 11
B, N, S, T = 8, 2, 5, 16  # T <= 17: one decode phase, so each size compiles one loop
FLOOR = 2  # sizes 16, 8, 4, 2
STOPS = (2, 5)  # sampled lengths 1..16; greedy ones spread with GREEDY_STOPS
GREEDY_STOPS = (7, 9)


@pytest.fixture(scope="module")
def model():
    return kjax_from_hf(random_hf_model(seed=0))


def _prompts():
    rng = np.random.default_rng(4)
    mask = np.ones((B, S), bool)
    mask[1, :2] = mask[5, :4] = False  # left padding, one single-token prompt
    return np.where(mask, rng.integers(0, V, (B, S)), 0).astype(np.int32), mask


def _both(model, stops, **kw):
    prompts, mask = _prompts()
    run = lambda floor: sampling.sample(model, prompts, mask, key=jax.random.key(2), n=N,
                                        max_new_tokens=T, stop_ids=stops, compact_floor=floor,
                                        **kw)  # fmt: skip
    return run(0), run(FLOOR)


def _live_counts(lengths):
    """Samples still decoding at each decode step 1..T-1 (a sample of length l: l - 1 steps)."""
    return np.array([(np.asarray(lengths) > step).sum() for step in range(1, T)])


@pytest.mark.parametrize(
    ("kw", "sliding"),
    [
        (dict(temperature=0.0), False),
        (dict(temperature=1.0), False),
        (dict(temperature=0.8, top_k=4, top_p=0.9), False),
        # ~11 s on 2 cores, over the default tier's budget: the slow tier.
        pytest.param(dict(temperature=1.0), True, marks=pytest.mark.slow),
    ],
    ids=["greedy", "sampled", "top_k_top_p", "sliding_window"],
)
def test_compacting_decode_gives_the_static_decodes_rollouts(model, kw, sliding):
    if sliding:  # every layer sees only the last 3 positions: own K/V slots drop out too
        config = dataclasses.replace(model.config, family=Family.MISTRAL, sliding_window=3)
        model = from_params(config, model.params())
    greedy = kw["temperature"] == 0.0
    static, compacted = _both(model, GREEDY_STOPS if greedy else STOPS, **kw)
    for name in ("tokens", "mask", "lengths"):
        np.testing.assert_array_equal(getattr(compacted, name), getattr(static, name))
    # Logits agree to rounding only: XLA:CPU's dots round a row differently at another
    # batch size (see the module's "Compaction" notes), so log-probs are close, not equal.
    for name in ("logprobs", "model_logprobs"):
        np.testing.assert_allclose(getattr(compacted, name), getattr(static, name), atol=1e-5)
    # The lengths spread: some decode step ran with at most a quarter of the rows live and
    # some still live, so the decode moved to 8 and then 4 rows (sizes 16, 8, 4, 2).
    live = _live_counts(static.lengths)
    assert np.any((live > 0) & (live <= B * N // 4)), live
    live_steps, run = sampling.decode_row_steps(static.lengths, (B * N,))
    _, run_compacted = sampling.decode_row_steps(static.lengths, (16, 8, 4, 2))
    assert run_compacted < run and live_steps <= run_compacted


def test_compacted_program_holds_each_size_once_and_compiles_once(model):
    c = model.config
    prompts, mask = _prompts()
    options = dict(config=c, n=N, max_new_tokens=T, stop_ids=STOPS, compact_floor=FLOOR)
    jaxpr = jax.make_jaxpr(
        lambda p, t, m: sampling.sample_params(p, t, m, jax.random.key(0), 1.0, **options)
    )(model.params(), prompts, mask)
    rows = [e.outvars[2].aval.shape[1] for e in _whiles(jaxpr.jaxpr)]  # own_k [L,rows,C,K,E]
    assert rows == [16, 8, 4, 2]
    # An RL step's calls (new parameter values, key, temperature) reuse one compilation.
    params = model.params()
    for step in range(3):
        sampling.sample_params(params, prompts, mask, jax.random.key(step),
                               jnp.float32(0.5 + step), **options)  # fmt: skip
        if step == 0:
            compiled = sampling.sample_params._cache_size()
        params = jax.tree.map(lambda w: w * 1.01, params)
    assert sampling.sample_params._cache_size() == compiled


def _whiles(jaxpr):
    """The while loops of a jaxpr, in program order, inside jit calls too."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "while":
            yield eqn
        elif "jaxpr" in eqn.params:
            yield from _whiles(eqn.params["jaxpr"].jaxpr)


def test_compact_sizes_and_row_steps():
    assert sampling.compact_sizes(32, 4) == (32, 16, 8, 4)
    assert sampling.compact_sizes(24, 1) == (24, 12, 6, 3)  # halves while whole
    assert sampling.compact_sizes(32, 4, shards=8) == (32, 16, 8)  # a multiple of the shards
    assert sampling.compact_sizes(8, 8) == (8,)
    with pytest.raises(ValueError, match="compact_floor"):
        sampling.compact_sizes(8, 0)
    # 4 samples of lengths 1, 2, 5, 9: live at steps 1..8 = 3, 2, 2, 2, 1, 1, 1, 1.
    lengths = np.array([[1, 2], [5, 9]])
    assert sampling.decode_row_steps(lengths, (4,)) == (0 + 1 + 4 + 8, 8 * 4)
    assert sampling.decode_row_steps(lengths, (4, 2, 1)) == (13, 4 + 2 * 3 + 1 * 4)


def test_bad_compact_floor_is_refused(model):
    prompts, mask = _prompts()
    with pytest.raises(ValueError, match="compact_floor"):
        sampling.sample(model, prompts, mask, key=jax.random.key(0), n=2, max_new_tokens=4,
                        compact_floor=-1)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), (1, 2, 4)])
def test_compacting_decode_on_eight_devices_gives_the_single_device_tokens(model, mesh_shape):
    """Sizes stay multiples of the batch's shards ((8, 1, 1): 16, 8; (1, 2, 4): the cache
    rows also take tensor, sharding.cache_spec)."""
    prompts, mask = _prompts()
    kw = dict(key=jax.random.key(5), n=N, max_new_tokens=T, top_p=0.9, stop_ids=STOPS)
    single = sampling.sample(model, prompts, mask, **kw)
    mesh = sharding.make_mesh(*mesh_shape)
    rows = sharding.batch_sharding(mesh)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        out = sampling.sample(sharding.shard(model, mesh), jax.device_put(prompts, rows),
                              jax.device_put(mask, rows), compact_floor=FLOOR, **kw)  # fmt: skip
    assert len(out.tokens.sharding.device_set) == 8
    for name in ("tokens", "mask", "lengths"):
        np.testing.assert_array_equal(getattr(out, name), getattr(single, name))
    np.testing.assert_allclose(out.logprobs, single.logprobs, atol=1e-5)
    live = _live_counts(single.lengths)
    assert np.any((live > 0) & (live <= B * N // 2)), live  # it compacted at least once
