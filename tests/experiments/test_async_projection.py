"""experiments.async_projection and kjax.scale.overlap_projection against closed forms."""

import json

import pytest

from experiments import async_projection
from kjax.scale import overlap_projection


def test_closed_forms():
    # sampler 1, update 2, no host work: the best split gives the sampler 1/3 of the chips
    # (1 / f = 2 / (1 - f)) and the step stays 3: linear scaling leaves nothing to gain.
    p = overlap_projection(1.0, 2.0)
    assert p["sync"] == 3.0 and p["one_group"] == 3.0
    assert p["split"] == pytest.approx(3.0, rel=1e-2) and p["split_fraction"] == pytest.approx(
        1 / 3, abs=2e-3
    )
    # host 0.5: hidden behind the update on one group; on a split, 1/f + 0.5 = 2/(1-f)
    # gives f = (3.5 - sqrt(3.5^2 - 4 * 0.5 * 1)) / (2 * 0.5) ... solved here by bisection.
    p = overlap_projection(1.0, 2.0, 0.5)
    assert p["sync"] == 3.5 and p["one_group"] == 3.0
    lo, hi = 1e-6, 1 - 1e-6
    for _ in range(100):
        f = (lo + hi) / 2
        lo, hi = (f, hi) if 1 / f + 0.5 > 2 / (1 - f) else (lo, f)
    assert p["split"] == pytest.approx(2 / (1 - f), rel=1e-2)


def test_cli_reads_plans_and_metrics(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([{"fits": True, "sampler_seconds": 10.0, "update_seconds": 20.0,
                                 "model": "m", "config": "c.py:passk", "topology": "v5p:4x4x4",
                                 "label": "compiled, not run"}]))  # fmt: skip
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": 0}] + [
        {"step": i, "time/sample": 1.0, "time/verify": 0.2, "time/advantages": 0.1,
         "time/update": 2.0, "time/step": 3.3} for i in range(1, 4)
    ]  # fmt: skip
    metrics.write_text("\n".join(json.dumps(r) for r in rows))
    assert async_projection.main([f"--plan={plan}", "--host_seconds=1", "--metrics",
                                  str(metrics)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert (
        "| m passk v5p:4x4x4 (compiled, not run; projection) | 10.00 | 1.00 | 20.00 | 31.00 |"
        in out
    )
    assert "| 1.00 | 0.30 | 2.00 | 3.30 | 3.00 |" in out and "| 3.30 |" in out


def test_bad_input_exits_2(tmp_path, capsys):
    assert async_projection.main(["--host_seconds=-1"]) == 2
    empty = tmp_path / "m.jsonl"
    empty.write_text('{"step": 0}\n')
    assert async_projection.main([f"--plan={tmp_path / 'missing.json'}"]) == 2
    assert async_projection.main(["--plan", "--metrics", str(empty)]) == 2
    assert "no RL step rows" in capsys.readouterr().err
