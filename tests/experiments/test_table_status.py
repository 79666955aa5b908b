"""--status (experiments.lab.table_status) reads a table's folders: every tuning and table
run in training order, as finished, started (its last logged step) or not started, and the
hours left at the finished runs' mean wall time."""

from __future__ import annotations

import json
import types

from experiments.lab import table_cli
from experiments.lab.claims import Claim
from experiments.lab.harness import Arm, Table
from experiments.lab.tuning import Tuning


def _table() -> Table:
    return Table(
        name="t",
        title="t",
        arms=(Arm("a", lambda c: c), Arm("b b", lambda c: c)),
        claims=(Claim("1", "a beats b", "m", "a", "b b"),),
        columns=(("m", "m"),),
        base=lambda seed, smoke: types.SimpleNamespace(steps=40),
        budget="",
        tuning=Tuning(grid=(1e-4, 3e-4), seeds=(1000,)),
    )


def test_status_lists_every_run_and_the_hours_left(tmp_path, capsys):
    done = tmp_path / "tuning" / "lr0.0001" / "a" / "seed1000"
    done.mkdir(parents=True)
    (done / "result.json").write_text(json.dumps({"status": "ok", "wall_s": 1200.0}))
    diverged = tmp_path / "runs" / "b_b" / "seed1"
    diverged.mkdir(parents=True)
    (diverged / "result.json").write_text(json.dumps({"status": "diverged", "wall_s": 600.0}))
    started = tmp_path / "runs" / "a" / "seed0" / "run"
    started.mkdir(parents=True)
    lines = [json.dumps({"step": s, "loss": 0.1}) for s in range(8)]  # a kill cut the last
    (started / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 8, "lo')
    (tmp_path / "runs" / "b_b" / "seed0" / "run").mkdir(parents=True)  # in its first eval
    assert table_cli.main(_table(), [f"--workdir={tmp_path}", "--seeds=2", "--status"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "stage" not in line]
    assert rows == [
        "| tuning, lr 0.0001 | a | 1000 | ok, 20.0 min |",
        "| tuning, lr 0.0003 | a | 1000 | not started |",
        "| tuning, lr 0.0001 | b b | 1000 | not started |",
        "| tuning, lr 0.0003 | b b | 1000 | not started |",
        "| table | a | 0 | started: step 7 of 40 |",
        "| table | a | 1 | not started |",
        "| table | b b | 0 | started: no step logged yet (the start evaluation comes first) |",
        "| table | b b | 1 | diverged, 10.0 min |",
    ]
    # 2 finished of 8, mean 15 min: 6 to go at 15 min = 1.5 h
    assert "finished 2 of 8 runs, 0.5 h of wall time (mean 15.0 min a run); 6 to go: " \
           "about 1.5 h" in out  # fmt: skip
    assert not (tmp_path / "jax_cache").exists()  # nothing was set up, nothing trained


def test_status_shows_the_tuning_scores_so_far_and_the_leading_rate(tmp_path, capsys):
    for lr, seed, objective in (("0.0001", 1000, 0.2), ("0.0003", 1000, 0.5)):
        done = tmp_path / "tuning" / f"lr{lr}" / "a" / f"seed{seed}"
        done.mkdir(parents=True)
        row = {"status": "ok", "wall_s": 60.0, "metrics": {"objective": objective}}
        (done / "result.json").write_text(json.dumps(row))
    torn = tmp_path / "tuning" / "lr0.0001" / "b_b" / "seed1000"
    torn.mkdir(parents=True)
    (torn / "result.json").write_text('{"status": "o')  # killed mid-write: not a score
    assert table_cli.main(_table(), [f"--workdir={tmp_path}", "--seeds=1", "--status"]) == 0
    out = capsys.readouterr().out
    assert "- a: lr 0.0001 0.200 (1 of 1 seeds), lr 0.0003 0.500 (1 of 1 seeds); leading: " \
           "lr 0.0003" in out  # fmt: skip
    assert "- b b: none finished" in out
