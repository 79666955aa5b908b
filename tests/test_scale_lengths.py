"""kjax.scale.lengths, the planner's real-token arithmetic: the --lengths flag, the
lengths of one step, the packed rows (against kjax.rl.packing), the decode schedule
(against kjax.sampling.decode_row_steps), the decode-step interpolation (against an
affine cost model it must reproduce), the real-token FLOPs (against the static count);
and one tiny plan compiled for a TPU topology (slow tier)."""

import json

import numpy as np
import pytest

from experiments import plan_scale
from kjax import sampling
from kjax.models.config import LlamaConfig
from kjax.scale import Shape, forward_flops
from kjax.scale import lengths as L

PRESET = "experiments/configs/llama31_8b_math.py:passk"


def test_mean_and_tail_give_that_mean_and_share_at_the_cap():
    lz = L.parse("mean=0.4,tail=0.05", 1024)
    got = lz.tokens(128, 16, 1024)
    assert got.shape == (128, 16) and got.min() >= 1 and got.max() == 1024
    # 5% of 2,048 samples at the cap, the rest uniform on [0, 2 m_b], m_b = 0.35 / 0.95.
    assert abs(np.sum(got == 1024) - 0.05 * 2048) <= 1
    body = got[got < 1024]
    assert body.max() <= np.ceil(2 * 0.35 / 0.95 * 1024)
    assert got.mean() == pytest.approx(0.4 * 1024, abs=0.6)  # rounding to tokens only
    # The same flag deals the same lengths; another seed the same multiset, other groups.
    assert np.array_equal(got, lz.tokens(128, 16, 1024))
    other = lz.tokens(128, 16, 1024, seed=1)
    assert np.array_equal(np.sort(other, None), np.sort(got, None))
    assert not np.array_equal(other, got)


def test_mean_tokens_top_prompt_and_a_histogram():
    lz = L.parse("mean_tokens=1019,tail=0,prompt=127", 3584)
    assert lz.mean == pytest.approx(1019 / 3584) and lz.prompt == 127 and lz.tail == 0
    assert lz.tokens(64, 32, 3584).mean() == pytest.approx(1019, abs=0.6)
    # A body above half the top: uniform on [2 m - top, top].
    assert L.parse("mean=0.4,tail=0,top=0.5", 100).body_range() == pytest.approx((0.3, 0.5))
    # Bins (0, 0.25] weight 3 and (0.25, 1] weight 1, no tail: mean 3/4 x 1/8 + 1/4 x 5/8.
    h = L.parse("hist=0.25:3/1:1,tail=0", 1000)
    assert h.mean == pytest.approx(0.75 * 0.125 + 0.25 * 0.625)
    q = h.tokens(10, 100, 1000)
    assert np.mean(q <= 250) == pytest.approx(0.75, abs=0.002)
    assert q.mean() == pytest.approx(h.mean * 1000, abs=0.6)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("mean=1.5", "mean=1.5 of T=1024 must be in"),
        ("mean=0.01,tail=0.2", "lower tail= or raise mean="),
        ("mean=x", "mean='x' is not a number"),
        ("avg=0.4", "unknown field 'avg'"),
        ("tail=0.1", "needs mean=F"),
        ("hist=0.5:1/0.25:1", "increasing edges"),
        ("hist=0.5", "must be EDGE:WEIGHT"),
        ("/nonexistent/metrics.jsonl", "no file"),
    ],
)
def test_bad_lengths_are_named(spec, message):
    with pytest.raises(ValueError, match="--lengths") as e:
        L.parse(spec, 1024)
    assert message in str(e.value)


def test_bad_lengths_flag_exits_2_before_compiling(capsys):
    argv = [f"--config={PRESET}", "--model=llama-3.1-8b", "--topology=v5p:2x2x2"]
    assert plan_scale.main([*argv, "--lengths=mean=0.4,tail=0.9"]) == 2
    assert "lower tail= or raise mean=" in capsys.readouterr().err


def test_a_runs_metrics_give_its_mean_and_longest(tmp_path):
    """The trainer's own per-step token stats (kjax.rl.loop.token_stats) of masks with
    known lengths, read back: mean = real / (B N T), longest / T."""
    from kjax.rl.loop import token_stats

    rng = np.random.default_rng(0)
    T, rows, means, tops = 64, [], [], []
    for _ in range(3):
        lengths = rng.integers(1, 50, size=(4, 8))
        mask = np.arange(T) < lengths[..., None]
        rows.append(json.dumps({"step": len(rows), **token_stats(mask, 2.0)}))
        means.append(lengths.sum() / mask.size)
        tops.append(lengths.max() / T)
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join([json.dumps({"step": 0, "eval/pass@1": 0.5}), *rows]) + "\n")
    lz = L.parse(f"{path},tail=0", T)
    assert lz.mean == pytest.approx(np.mean(means)) and lz.top == pytest.approx(np.mean(tops))
    path.write_text(json.dumps({"step": 1, "loss": 0.1}) + "\n")
    with pytest.raises(ValueError, match="no step with tokens/padding"):
        L.parse(str(path), T)


def test_rows_needed_and_bucket_are_the_packings():
    import jax.numpy as jnp

    from kjax.rl import packing

    rng = np.random.default_rng(1)
    for B, N, T in [(12, 8, 32), (3, 5, 7)]:
        lengths = rng.integers(0, T + 1, size=(B, N))
        lengths[0, 0] = T
        mask = jnp.asarray(np.arange(T) < lengths[..., None])
        needed = int(packing.rows_needed(mask))
        assert L.rows_needed(lengths, T) == needed
        assert L.packed_rows(needed, N) == packing.bucket(needed, N)


def test_batch_rows_are_the_batch_packed_steps():
    """The planner's rl.pack=BATCH rows (kjax.scale.real.batch_rows from the lengths) are
    what BatchPackedStep sizes from the mask, for microbatches and shards."""
    from types import SimpleNamespace

    import jax.numpy as jnp

    from kjax.rl import batch_packing
    from kjax.scale import real

    rng = np.random.default_rng(2)
    for B, N, T, chunks, shards in [(12, 8, 32, 1, 1), (12, 8, 32, 2, 3), (8, 5, 7, 4, 4)]:
        lengths = rng.integers(0, T + 1, size=(B, N))
        mask = jnp.asarray(np.arange(T) < lengths[..., None])
        used = L.group_rows(lengths, T)
        np.testing.assert_array_equal(used, batch_packing.group_rows(mask))
        step = batch_packing.BatchPackedStep(None, chunks, shards)
        batch = SimpleNamespace(tokens=mask, mask=mask)
        needed, rows, total = real.batch_rows(used, chunks, B, N, shards)
        assert rows == step.rows_of(batch) and needed <= rows <= step.total(batch)
        P = batch_packing.layout_shards(B // chunks, shards)
        assert total == chunks * P * rows


def test_decode_schedule_counts_the_samplers_row_steps():
    """The schedule's rows x steps is kjax.sampling.decode_row_steps' run count, for the
    static sampler and the compacting one, and its steps fall in the sampler's phases."""
    rng = np.random.default_rng(2)
    T = 40
    phases = sampling._phases(T)
    lengths = rng.integers(1, T + 1, size=(4, 8))
    for sizes in [(32,), sampling.compact_sizes(32, 1), sampling.compact_sizes(32, 8, 2)]:
        sched = L.decode_schedule(lengths, sizes, phases)
        assert sum(r * n for r, _, n in sched) == sampling.decode_row_steps(lengths, sizes)[1]
        assert sum(n for _, _, n in sched) == lengths.max() - 1
        for window, end in phases:
            start = max([1] + [e for _, e in phases if e < end])
            steps = sum(n for _, w, n in sched if w == window)
            assert steps == max(0, min(end, lengths.max()) - start)


def test_compacted_step_reproduces_an_affine_cost():
    """Terms a + b r + c r w (weights read once, per-row work, per-row window reads),
    compiled at the full batch (two windows) and two compacted sizes (last window): the
    interpolation gives the model back at every other size and window."""
    a, b, c = np.array([1.0, 2.0, 0.5]), np.array([0.1, 0.02, 0.0]), np.array([1e-4, 3e-4, 0])

    def model(r, w):
        return tuple(a + b * r + c * r * w)

    full, w1, w2 = 2048, 16, 1023
    kw = dict(full_rows=full, static=(model(full, w1), model(full, w2)), windows=(w1, w2),
              compact=[(1024, model(1024, w2)), (8, model(8, w2))])  # fmt: skip
    for r, w in [(512, 16), (64, 300), (8, 1023), (2048, 500), (1024, 64), (4, 31)]:
        assert L.compacted_step(r, w, **kw) == pytest.approx(model(r, w))
    one = dict(kw, compact=[(8, model(8, w2))])  # one size: the line through the full step
    assert L.compacted_step(256, 100, **one) == pytest.approx(model(256, 100))
    # The sampler: prefill + steps, each at max(terms) or their sum.
    sched = [(2048, 16, 3), (8, 1023, 2)]
    pre = (0.5, 4.0, 1.0)
    step = lambda r, w: L.compacted_step(r, w, **kw)  # noqa: E731
    assert L.sampler_seconds(pre, sched, step) == pytest.approx(
        4.0 + 3 * max(model(2048, 16)) + 2 * max(model(8, 1023))
    )
    assert L.sampler_seconds(pre, sched, step, serial=True) == pytest.approx(
        5.5 + 3 * sum(model(2048, 16)) + 2 * sum(model(8, 1023))
    )


def test_real_flops_at_the_cap_are_the_static_count():
    c = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_layers=3,
                    num_heads=4, num_kv_heads=2, head_dim=16)  # fmt: skip
    B, N, S, T = 3, 4, 10, 12
    full = np.full((B, N), T)
    assert L.real_forward_flops(c, S, full) == pytest.approx(forward_flops(c, Shape(B, N, S, T)))
    # Each token fewer takes its matmuls, head and attention row away.
    short = full.copy()
    short[0, 0] = T - 1
    per_token = 2 * (L.matmul_params(c) + 64 * 128) + 4 * 4 * 16 * 3 * (S + 2 * T - 1)
    assert L.real_forward_flops(c, S, full) - L.real_forward_flops(c, S, short) == per_token


@pytest.mark.slow
def test_tiny_real_plan_with_batch_packing_compiles_for_a_tpu_topology():
    """The same plan with rl.pack=BATCH: R per batch shard (4 shards of 2 groups here) at
    the packed update's analytic FLOPs for the rows it runs."""
    import dataclasses
    import sys

    from kjax import scale
    from kjax.rl import batch_packing
    from kjax.rl.step_config import PackMode
    from kjax.scale import real

    if scale.libtpu_missing() is not None:
        pytest.skip(scale.libtpu_missing())
    sys.path.insert(0, "tests")
    from test_scale import CFG, CONFIG

    cfg = dataclasses.replace(CFG, max_new_tokens=16, samples=8)
    p = scale.plan(cfg, CONFIG, "v5e:2x2", (1, 4, 1), microbatches=1)
    lz = L.parse("mean=0.4,tail=0.1", 16)
    rp = real.plan_real(cfg, CONFIG, p, lz, pack=PackMode.BATCH)
    tokens = lz.tokens(8, 8, 16)
    needed = batch_packing.shard_rows(L.group_rows(tokens, 16), 1, 4)
    assert (rp.pack, rp.rows_of, rp.rows_needed) == ("batch", 16, needed)
    assert rp.rows == batch_packing.bucket(needed, 16) and rp.total_rows == 4 * rp.rows
    assert rp.total_rows <= 8 * L.packed_rows(L.rows_needed(tokens, 16), 8)  # GROUP: 32
    assert rp.update_flops_ratio == pytest.approx(1.0, rel=0.02)
    assert "rl.pack=BATCH" in real.report(rp)
    assert "per shard" in real.table_row({**_summary_stub(), "real": real.summary(rp)})


def _summary_stub() -> dict:
    return {"model": "tiny", "config": "c:p", "topology": "v5e:2x2", "mesh": [1, 4, 1],
            "microbatches": 1, "shape": {"N": 8}, "hbm_bytes": 16 << 30}  # fmt: skip


@pytest.mark.slow
def test_tiny_real_plan_compiles_for_a_tpu_topology():
    """A tiny plan on v5e:2x2 with --lengths' projection: the packed update compiles at
    the R the lengths need, at its analytic FLOPs; the compacted decode steps at their
    closed-form FLOPs (each row its prompt's copy: a step of B = r prompts, N = 1)."""
    import dataclasses
    import sys

    from kjax import scale
    from kjax.scale import decode_flops, real

    if scale.libtpu_missing() is not None:
        pytest.skip(scale.libtpu_missing())
    sys.path.insert(0, "tests")
    from test_scale import CFG, CONFIG

    cfg = dataclasses.replace(CFG, max_new_tokens=16, samples=8)
    p = scale.plan(cfg, CONFIG, "v5e:2x2", (1, 4, 1), microbatches=1)
    lz = L.parse("mean=0.4,tail=0.1", 16)
    rp = real.plan_real(cfg, CONFIG, p, lz)
    tokens = lz.tokens(8, 8, 16)
    assert rp.rows == L.packed_rows(L.rows_needed(tokens, 16), 8) < 8
    assert rp.update_flops_ratio == pytest.approx(1.0, rel=0.02)
    assert rp.sizes == sampling.compact_sizes(64, 1, 4)
    # At B N / 2 rows the compacted step's dots are its closed form. At the smallest size
    # (one row per chip) XLA lowers the one-row matmuls to other ops, which hlo_stats does
    # not count as FLOPs (so there the compute term is low; such a step is HBM/ICI-bound).
    (r, x), (small, _) = rp.compact
    assert (r, small) == (32, 4)
    assert x.flops * 4 == pytest.approx(decode_flops(CONFIG, Shape(r, 1, 8, 16), 15), rel=0.02)
    assert rp.real_tokens == 64 * 8 + tokens.sum()
    assert rp.tokens_per_s_per_chip == pytest.approx(rp.real_tokens / rp.step_seconds / 4)
    assert rp.fits and sum(n for _, _, n in rp.schedule) == tokens.max() - 1


def test_docs_real_token_table_is_the_committed_plans():
    """Every row of docs/scale.md's real-token table comes from a committed --out summary
    under experiments/results/plan_scale/lengths/."""
    import pathlib

    from kjax.scale import real

    root = pathlib.Path(__file__).parents[1]
    doc = (root / "docs" / "scale.md").read_text()
    plans = sorted((root / "experiments" / "results" / "plan_scale" / "lengths").glob("*.json"))
    assert plans and real.TABLE_HEADER in doc
    for path in plans:
        for summary in json.loads(path.read_text()):
            assert summary["real"]["label"] == "compiled, not run"
            assert real.table_row(summary) in doc, path.name
