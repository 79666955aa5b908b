"""experiments.lab.compare: rows matched by (arm, seed), differences and verdict changes."""

import json

from experiments.lab import compare
from experiments.lab.claims import Claim, ClaimKind


class _Table:
    claims = (
        Claim("1", "b beats a", "m", "b", "a"),
        Claim("2", "c beats a", "m", "c", "a"),  # arm c is in neither run: not judged
        Claim("3", "b below 0", "m", "b", None, ClaimKind.LESS),
    )


def _rows(b_offset):
    rows = []
    for seed in range(4):
        rows.append({"arm": "a", "seed": seed, "status": "ok", "metrics": {"m": 0.5}})
        value = 0.5 + b_offset + 0.001 * seed
        rows.append({"arm": "b", "seed": seed, "status": "ok", "metrics": {"m": value}})
    return rows


def test_identical_runs_are_bit_identical_and_keep_every_verdict():
    out = compare.compare(_Table, _rows(0.1), _rows(0.1))
    assert len(out["rows"]) == 8 and all(r["identical"] for r in out["rows"])
    assert [v["claim"] for v in out["claims"]] == ["1", "3"]
    assert not any(v["changed"] for v in out["claims"])


def test_a_moved_arm_shows_its_difference_and_verdict_change():
    out = compare.compare(_Table, _rows(0.1), _rows(-0.1))
    moved = [r for r in out["rows"] if r["arm"] == "b"]
    assert all(abs(r["max_abs_diff"] - 0.2) < 1e-12 and not r["identical"] for r in moved)
    changed = {v["claim"]: (v["a"], v["b"]) for v in out["claims"] if v["changed"]}
    assert changed["1"] == ("reproduced", "not reproduced: opposite direction")


def test_rows_from_two_cpus_are_named_with_their_instruction_sets(tmp_path, capsys):
    epyc = {"cpu": "AMD EPYC", "cpu_features": ["avx", "avx2", "fma"]}
    xeon = {"cpu": "Intel Xeon", "cpu_features": ["avx", "avx2", "fma", "avx512f", "amx_tile"]}
    a = [{**r, "provenance": epyc} for r in _rows(0.1)]
    b = [{**r, "provenance": xeon} for r in _rows(0.1)]
    out = compare.compare(_Table, a, b)
    assert out["machines"] == [
        ["AMD EPYC [avx avx2 fma]"],
        ["Intel Xeon [avx avx2 fma avx512f amx_tile]"],
    ]
    old = [{**r, "provenance": {"cpu": "AMD EPYC"}} for r in _rows(0.1)]  # before cpu_features
    assert compare.machines(old) == ["AMD EPYC [?]"] and compare.machines(_rows(0)) == [
        "no provenance"
    ]
    for name, rows in (("a", a), ("b", b), ("same", a)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = "tang2025_table"  # any table module: these rows' arms are not its arms
    assert (
        compare.main(["--table", table, str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 0
    )
    assert "ran on AMD EPYC [avx avx2 fma] vs Intel Xeon" in capsys.readouterr().out
    assert (
        compare.main(["--table", table, str(tmp_path / "a.jsonl"), str(tmp_path / "same.jsonl")])
        == 0
    )
    assert "ran on" not in capsys.readouterr().out
