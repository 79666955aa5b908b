"""experiments.tables.inference_strategies: the --smoke run end to end, and its allocation table."""

import json

import numpy as np
import pytest

from experiments.tables import inference_strategies as exp


def test_smoke_run_writes_consistent_results(tmp_path):
    assert exp.main(["--workdir", str(tmp_path), "--smoke"]) == 0
    for name in ("inference.md", "accuracy_vs_n.png", "results.json"):
        assert (tmp_path / name).stat().st_size > 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert sorted(results) == ["arith", "countdown"]  # each policy on its own task
    for r in results.values():
        assert sorted(r["curves"]) == sorted(exp.SELECTORS)
        # With one sample every selector picks it: all curves start at the mean accuracy.
        at_one = [curve["1"] for curve in r["curves"].values()]
        np.testing.assert_allclose(at_one, at_one[0], atol=1e-6)
        for a in r["allocation"]:
            assert sum(a["counts"]) == a["budget"]  # unit costs: the whole budget is spent
            assert 0.0 <= a["allocation"] <= 1.0 and a["single"] <= a["best_single_on_test"]


def fake_draw(correct):
    correct = np.asarray(correct, bool)
    zeros = np.zeros(correct.shape, np.float32)
    return exp.Draw(
        [[""] * correct.shape[1]] * len(correct),
        correct.astype(np.float32),
        np.where(correct, 0, 1).astype(np.int32),
        zeros,
        zeros,
    )


def test_allocation_mixes_temperatures_that_solve_different_problems():
    # T=0.4 solves only the first 4 problems, T=1.0 only the last 4; T=0.7 solves nothing.
    first, none = np.zeros((8, 8), bool), np.zeros((8, 8), bool)
    first[:4, :4] = True
    last = first[::-1].copy()
    draws = [fake_draw(first), fake_draw(none), fake_draw(last)]
    (row,) = exp.allocation_rows(draws, draws, budgets=(4,), n=8)
    assert row["counts"][0] > 0 and row["counts"][2] > 0 and row["counts"][1] == 0
    assert row["allocation"] > row["single"] == pytest.approx(row["best_single_on_test"])


def test_bad_checkpoint_exits_with_a_message(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        exp.main(["--workdir", str(tmp_path), "--checkpoint", str(tmp_path / "nope")])
    assert e.value.code == 2 and "no experiment.json" in capsys.readouterr().err
