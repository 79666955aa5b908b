"""The harness's statistics against scipy and their definitions (one-sided and TOST
p-values, Holm, MDE, verdicts), its structured metric keys, provenance, and a run that
fails: a broken arm stops the table, a diverged one is a row. No model is trained here."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import itertools
import json
import math
import os
import pathlib
import platform
import re
import shutil
import subprocess
import time

import jax
import numpy as np
import pytest
from scipy import stats

from experiments.lab import claims, harness, table_cli, table_runs, tuning
from experiments.lab.claims import Claim, ClaimKind, MetricKey
from experiments.lab.harness import Arm
from experiments.lab.provenance import (
    CPU_FEATURES,
    code_digest,
    cpu_features,
    git_commit,
    provenance,
)
from kjax.rl.config import (
    ArithConfig,
    BonAnchor,
    EvalSplit,
    Objective,
    ObjectiveConfig,
    TrainConfig,
)

# Five paired differences standardised to mean 0 and sd 1: x = mean + sd * Z has its 95%
# t-interval at exactly mean +- t_{0.975,4} sd / sqrt(5).
Z = np.array([-1.3, -0.4, 0.1, 0.5, 1.1])
Z = (Z - Z.mean()) / Z.std(ddof=1)


def diffs_with_interval(low: float, high: float, level: float = 0.95) -> np.ndarray:
    """Paired differences over 5 seeds whose `level` t-interval is [low, high]."""
    t = stats.t.ppf(0.5 + level / 2, len(Z) - 1)
    return (low + high) / 2 + (high - low) / 2 * math.sqrt(len(Z)) / t * Z


def rows_of(values: dict[str, list[float]]) -> list[dict]:
    """Finished rows of metric "m", arms x seeds."""
    return [
        {"arm": arm, "seed": s, "status": "ok", "metrics": {"m": float(v)}}
        for arm, vs in values.items()
        for s, v in enumerate(vs)
    ]


# ------------------------------------------------------------------------------ p-values


@pytest.mark.parametrize("delta", [0.0, -0.02, 0.05])
def test_one_sided_p_is_scipys_paired_t_test(delta):
    a = np.array([0.52, 0.61, 0.48, 0.57, 0.66, 0.50])
    b = np.array([0.47, 0.55, 0.49, 0.50, 0.58, 0.51])
    for alternative, p in (("greater", claims.p_greater), ("less", claims.p_less)):
        ref = stats.ttest_rel(a, b + delta, alternative=alternative).pvalue
        assert p(a - b, delta) == pytest.approx(ref, rel=1e-10)
    assert math.isnan(claims.p_greater([0.1]))  # one seed: no test


def test_tost_p_is_below_5_percent_exactly_when_the_90_percent_interval_is_inside():
    for low, high in ((-0.019, 0.015), (-0.021, 0.015), (-0.01, 0.0201), (0.03, 0.05)):
        d = diffs_with_interval(low, high, level=0.90)
        ref = max(
            stats.ttest_1samp(d, -0.02, alternative="greater").pvalue,
            stats.ttest_1samp(d, 0.02, alternative="less").pvalue,
        )
        assert claims.p_tost(d, 0.02) == pytest.approx(ref, rel=1e-10)
        assert (claims.p_tost(d, 0.02) < 0.05) == (-0.02 < low and high < 0.02)


# ---------------------------------------------------------------------------------- Holm


def test_holm_by_hand():
    # Sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max.
    adjusted = claims.holm([0.01, 0.04, 0.03, 0.005])
    np.testing.assert_allclose(adjusted, [0.03, 0.06, 0.06, 0.02], rtol=1e-12)
    adjusted = claims.holm([0.3, math.nan, 0.6])  # a claim without seeds is not tested
    np.testing.assert_allclose(adjusted, [0.6, math.nan, 0.6])


def test_holm_is_closed_testing_with_bonferroni():
    """Holm's adjusted p_i = max over every subset S holding i of min(1, |S| min_{j in S} p_j)
    (the closed testing procedure with Bonferroni local tests), by enumeration."""
    p = np.array([0.012, 0.3, 0.004, 0.02, 0.2, 0.04])
    ref = []
    for i in range(len(p)):
        subsets = (
            s for r in range(1, len(p) + 1) for s in itertools.combinations(range(len(p)), r)
        )
        ref.append(max(min(1.0, len(s) * p[list(s)].min()) for s in subsets if i in s))
    np.testing.assert_allclose(claims.holm(p), ref, rtol=1e-12)


def test_a_table_judges_its_claims_together():
    """Three against-0 claims with one-sided p 0.001, 0.02, 0.5: alone, the second is
    reproduced (0.02 < 0.025); in the table its Holm p is 2 x 0.02 = 0.04 and it is not."""
    n = len(Z)
    values = {
        f"a{i}": stats.t.isf(p, n - 1) / math.sqrt(n) + Z for i, p in enumerate((0.001, 0.02, 0.5))
    }
    family = [Claim(f"c{i}", "", "m", f"a{i}", None, equivalence_margin=0.01) for i in range(3)]
    rows = rows_of(values)
    judged = claims.judge_all(rows, family)
    np.testing.assert_allclose([j["p"] for j in judged], [0.001, 0.02, 0.5], rtol=1e-9)
    np.testing.assert_allclose([j["p_holm"] for j in judged], [0.003, 0.04, 0.5], rtol=1e-9)
    assert [j["verdict"] for j in judged] == [
        claims.REPRODUCED,
        claims.INCONCLUSIVE,
        claims.INCONCLUSIVE,
    ]
    assert claims.judge(rows, family[1])["verdict"] == claims.REPRODUCED


# ------------------------------------------------------------------------------ verdicts


def interval_verdict(
    kind: ClaimKind, d: np.ndarray, margin: float, eq: float, paper: float | None = None
) -> str:
    """The verdict of one claim (a family of one: Holm changes nothing) read off its
    t-intervals, no p-values: 95% for a one-sided test at 2.5%, 90% for two at 5%."""
    _, low, high = claims.t_interval(d)
    half90 = stats.t.ppf(0.95, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    low90, high90 = d.mean() - half90, d.mean() + half90
    reproduced, opposite = {
        ClaimKind.GREATER: (low > 0, high < 0),
        ClaimKind.LESS: (high < 0, low > 0),
        ClaimKind.NONINFERIOR: (low > -margin, high < -margin),
        ClaimKind.EQUIVALENT: (-margin < low90 and high90 < margin, low > margin or high < -margin),
    }[kind]
    if reproduced:
        return claims.REPRODUCED
    if opposite:
        return claims.opposite(kind)
    if paper is not None:  # the 95% interval on the near side of the paper's effect
        excluded = high < paper if kind is ClaimKind.GREATER else low > paper
        return claims.below_paper(paper) if excluded else claims.INCONCLUSIVE
    return claims.no_effect(eq) if -eq < low90 and high90 < eq else claims.INCONCLUSIVE


INTERVALS = [
    (0.01, 0.05),
    (-0.05, -0.01),
    (-0.01, 0.05),
    (-0.015, -0.001),
    (-0.05, -0.025),
    (-0.03, 0.05),
    (-0.01, 0.015),
    (-0.01, 0.021),
    (0.03, 0.05),
    (-0.02, 0.02),
    (-0.2, 0.3),
    (-0.021, -0.019),
    (-0.01, 0.0249),  # just below a paper effect of +0.025
    (-0.01, 0.0251),  # just above it
    (-0.0249, 0.01),  # the mirror for a LESS claim's -0.025
    (-0.0251, 0.01),
    (-0.02, 0.027),  # inside +-0.03 at 90%, but the paper's +0.025 is inside too
]
PAPER = {ClaimKind.GREATER: 0.025, ClaimKind.LESS: -0.025}


KINDS = [(kind, None) for kind in ClaimKind] + list(PAPER.items())  # (kind, paper effect)


@pytest.mark.parametrize(("kind", "paper"), KINDS)
@pytest.mark.parametrize(("low", "high"), INTERVALS)
def test_verdict_of_one_claim_is_its_interval_reading(kind, low, high, paper):
    d = diffs_with_interval(low, high)
    rows = rows_of({"a": d})
    claim = Claim("x", "", "m", "a", None, kind, 0.02, 0.03, paper_effect=paper)
    got = claims.judge(rows, claim)["verdict"]
    assert got == interval_verdict(kind, d, 0.02, 0.03, paper)
    assert got in claims.possible_verdicts(claim)
    if paper is not None:  # 0.03 exceeds the paper's 0.025: never "no effect > 0.03"
        assert "no effect" not in got


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (-0.015, -0.001, claims.REPRODUCED),  # below 0 but inside the margin
        (-0.05, -0.025, claims.opposite(ClaimKind.NONINFERIOR)),  # worse beyond the margin
        (-0.03, 0.05, claims.INCONCLUSIVE),
    ],
)
def test_noninferiority_is_judged_against_the_margin_not_zero(low, high, expected):
    rows = rows_of({"a": diffs_with_interval(low, high)})
    claim = Claim("x", "", "m", "a", None, ClaimKind.NONINFERIOR, margin=0.02)
    assert claims.judge(rows, claim)["verdict"] == expected


def test_a_null_result_bounds_the_effect():
    rows = rows_of({"a": 0.001 + 0.005 * Z})  # 90% interval about [-0.004, 0.006]
    j = claims.judge(rows, Claim("x", "", "m", "a", None))
    assert j["verdict"] == claims.no_effect(0.03)
    assert j["verdict"] == "not reproduced: no effect larger than 0.03 (kjax's margin)"
    assert j["p_equivalent"] < 0.05 < j["p"]


def test_an_interval_beyond_the_margin_is_never_no_effect_even_when_holm_hides_it():
    """Table 2's 2d' case: a noninferiority claim whose whole 95% interval lies beyond its
    -0.02 margin (unadjusted p < 0.025), in a family of two where Holm doubles that p past
    0.025, and inside +-0.03 at 90%: before, "no effect larger than 0.03"; now the label says
    the interval is worse than the margin, before Holm only."""
    d = diffs_with_interval(-0.027, -0.0205)
    family = [
        Claim("x", "", "m", "a", None, ClaimKind.NONINFERIOR, margin=0.02),
        Claim("y", "", "m", "b", None),
    ]
    judged = claims.judge_all(rows_of({"a": d, "b": 0.1 + 0.3 * Z}), family)
    x = judged[0]
    assert x["p_opposite"] < 0.025 < x["p_opposite_holm"] and x["p_bound_holm"] < 0.05
    assert x["verdict"] == claims.opposite(ClaimKind.NONINFERIOR, before_holm=True)
    assert x["verdict"] == "not reproduced: worse than the margin (before Holm only)"
    alone = claims.judge(rows_of({"a": d}), family[0])
    assert alone["verdict"] == "not reproduced: worse than the margin"


def test_a_paper_effect_below_the_margin_replaces_no_effect():
    """Table 3's 3a case: Bagirov et al.'s effect is +0.025, below kjax's 0.03; a difference
    near 0 is "excludes the paper's effect (+0.025)", in its own Holm family."""
    rows = rows_of({"a": 0.001 + 0.005 * Z})
    c = Claim("x", "", "m", "a", None, paper_effect=0.025)
    j = claims.judge(rows, c)
    assert j["verdict"] == "not reproduced: excludes the paper's effect (+0.025)"
    assert j["p_bound"] == j["p_paper"] < 0.025


@pytest.mark.parametrize(
    "kind, effect",
    [(ClaimKind.GREATER, -0.1), (ClaimKind.LESS, 0.1), (ClaimKind.NONINFERIOR, 0.1)],
)
def test_a_paper_effect_must_point_the_claims_way(kind, effect):
    with pytest.raises(ValueError, match="paper_effect"):
        Claim("x", "", "m", "a", None, kind, paper_effect=effect)


# ----------------------------------------------------------------------------------- MDE


@pytest.mark.parametrize("n", [5, 10, 30])
def test_mde_has_80_percent_power_under_the_noncentral_t(n):
    sd = 0.07
    effect = claims.mde(sd, n)
    df = n - 1
    power = stats.nct.sf(stats.t.ppf(0.975, df), df, effect * math.sqrt(n) / sd)
    assert power == pytest.approx(0.8, abs=0.01)


def test_seeds_for_mde_is_the_fewest_that_reach_the_target():
    sd, target = 0.05, 0.03
    n = claims.seeds_for_mde(sd, target)
    assert claims.mde(sd, n) <= target < claims.mde(sd, n - 1)
    assert claims.seeds_for_mde(0.0, target) == 2
    with pytest.raises(ValueError, match="target > 0"):
        claims.seeds_for_mde(sd, 0.0)


# ---------------------------------------------------------------------------- metric keys


def test_metric_keys_are_structured():
    for key in (MetricKey("pass", 8), MetricKey("maj", 16), MetricKey("pass", 256, "epoch1")):
        assert MetricKey.parse(str(key)) == key
    assert str(MetricKey("pass", 256, "epoch1")) == "epoch1/pass@256"
    assert MetricKey.find("eval/max@32") == MetricKey("max", 32, "eval")
    assert MetricKey.find("gradvar") is None
    for bad in ("pass@", "pass@x", "@8", "pass@0", "pass@8@2", "epoch1/@4"):
        with pytest.raises(ValueError, match="is not NAME@K"):
            MetricKey.find(bad)


# ----------------------------------------------------------------------------- provenance


def test_provenance_records_versions_machine_and_commit():
    p = provenance()
    for package in ("jax", "jaxlib", "flax", "optax", "numpy"):
        assert p["versions"][package] == importlib.metadata.version(package)
    assert p["versions"]["jax"] == jax.__version__ and p["versions"]["numpy"] == np.__version__
    assert p["versions"]["python"] == platform.python_version()
    assert p["cores"] == os.cpu_count()
    assert p["backend"] == jax.default_backend() and len(p["devices"]) == jax.device_count()
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            line.partition(":")[2].strip()
            for line in cpuinfo.read_text().splitlines()
            if line.startswith("model name")
        ]
        assert p["cpu"] == (names[0] if names else platform.processor() or "unknown")
    assert set(p["cpu_features"]) <= set(CPU_FEATURES)
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?|unknown", p["commit"])
    assert json.loads(json.dumps(p)) == p


def test_cpu_features_are_read_from_the_flags_line_in_a_fixed_order():
    x86 = "processor\t: 0\nflags\t\t: fpu sse avx2 amx_tile fma avx avx512f pni\n"
    assert cpu_features(x86) == ["avx", "avx2", "fma", "avx512f", "amx_tile"]
    assert cpu_features("Features\t: fp asimd evtstrm sve\n") == ["asimd", "sve"]
    assert cpu_features("processor\t: 0\n") == []


def test_git_commit_is_head_with_a_dirty_mark(tmp_path, monkeypatch):
    def git(*args):
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=tmp_path,
            check=True,
            capture_output=True,
            text=True,
        )

    assert git_commit(tmp_path) == "unknown"  # not a checkout
    git("init", "-q")
    (tmp_path / "f.txt").write_text("a")
    git("add", "f.txt")
    git("commit", "-qm", "c")
    head = git("rev-parse", "HEAD").stdout.strip()
    assert git_commit(tmp_path) == head
    (tmp_path / "new.txt").write_text("untracked files do not make a tree dirty")
    assert git_commit(tmp_path) == head
    (tmp_path / "f.txt").write_text("b")
    assert git_commit(tmp_path) == head + "-dirty"
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))
    assert git_commit(tmp_path) == "unknown"


def test_code_digest_moves_with_any_source_edit_and_no_other_file(tmp_path):
    """The start-evaluation salt (harness.rl_execute): an edit that git_commit cannot see
    (a dirty tree, an install without git) still changes it."""
    (tmp_path / "kjax" / "rl").mkdir(parents=True)
    (tmp_path / "experiments").mkdir()
    (tmp_path / "kjax" / "rl" / "a.py").write_text("x = 1\n")
    (tmp_path / "experiments" / "b.py").write_text("y = 2\n")
    first = code_digest(tmp_path, versions=False)
    assert code_digest(tmp_path, versions=False) == first
    assert code_digest(tmp_path) != first  # jax's, jaxlib's, numpy's versions count
    (tmp_path / "experiments" / "notes.md").write_text("not source")
    (tmp_path / "other.py").write_text("outside kjax/ and experiments/")
    assert code_digest(tmp_path, versions=False) == first
    digests = {first}
    for parts, text in ((("kjax", "rl", "a.py"), "x = 3\n"), (("kjax", "new.py"), ""),
                        (("experiments", "b.py"), "y = 2  \n")):  # fmt: skip
        tmp_path.joinpath(*parts).write_text(text)
        digests.add(code_digest(tmp_path, versions=False))
    assert len(digests) == 4
    (tmp_path / "kjax" / "new.py").rename(tmp_path / "kjax" / "renamed.py")  # a path counts
    assert code_digest(tmp_path, versions=False) not in digests


# ---------------------------------------------------------------------------- runs, CLI


@dataclasses.dataclass(frozen=True)
class _SFT:
    steps: int = 0  # no warm start to build
    cache_dir: str = ""
    seed: int | None = None


@dataclasses.dataclass(frozen=True)
class _Config:
    """Just enough of a TrainConfig for with_seed and warm_start."""

    seed: int = 0
    sft: _SFT = _SFT()
    value: float = 0.5


def _execute(table, arm, seed, run_dir, ctx):
    cfg = harness.arm_config(table, arm, seed, ctx)
    if not math.isfinite(cfg.value):
        raise FloatingPointError("loss is not finite at RL step 3\nmore")
    return {"m": cfg.value + 0.01 * seed}


def _table(*arms: Arm) -> harness.Table:
    return harness.Table(
        "t",
        "t",
        arms,
        (Claim("1", "b beats a", "m", arms[-1].name, arms[0].name),),
        (("m", "m"),),
        lambda seed, smoke: _Config(),
        "b",
        execute=_execute,
        plot=lambda *a: None,
    )


def test_a_broken_arm_stops_the_table(tmp_path, capsys):
    def broken(cfg):
        raise AttributeError("'Config' object has no attribute 'objectiv'")

    table = _table(Arm("a", lambda c: c), Arm("broken", broken))
    ctx = harness.Context(tmp_path, tmp_path / "sft", smoke=False, log=lambda *a: None)
    with pytest.raises(harness.ArmFailed, match=r"arm 'broken' at seed 0 .*AttributeError") as e:
        table_runs.run_one(table, table.arms[1], 0, ctx)
    assert isinstance(e.value.__cause__, AttributeError)
    assert table_cli.main(table, ["--workdir", str(tmp_path), "--seeds", "2"]) == 1
    err = capsys.readouterr().err
    assert "error: table t: arm 'broken' at seed 0 failed with AttributeError" in err
    assert not (tmp_path / "t.md").exists()  # no table from a broken arm
    assert (tmp_path / "runs" / "a" / "seed0" / "result.json").exists()  # kept for the rerun
    assert not (tmp_path / "runs" / "broken" / "seed0" / "result.json").exists()


def test_run_wall_sums_every_process_up_to_its_last_write(tmp_path):
    """Each interrupted process counts from its start to the last file it wrote; one that
    wrote nothing counts 0; the running one counts up to now."""
    table_runs.begin_attempt(tmp_path, now=10.0)  # killed before it wrote anything
    table_runs.begin_attempt(tmp_path, now=20.0)
    written = tmp_path / "run" / "metrics.jsonl"
    written.parent.mkdir()
    written.write_text("{}\n")
    os.utime(written, (50.0, 50.0))  # its last step's line, then it was killed
    table_runs.begin_attempt(tmp_path, now=60.0)
    assert table_runs.run_wall(tmp_path, now=70.0) == (0.0 + 30.0 + 10.0, 3)


def test_a_resumed_run_reports_the_time_of_the_process_that_was_killed(tmp_path):
    """A table run resumed after a kill reports both processes' time in its row, not only
    the last process's (what it did before: table 7's compute undercounted its resumes)."""
    table = _table(Arm("a", lambda c: c))
    run_dir = tmp_path / "runs" / "a" / "seed0"
    run_dir.mkdir(parents=True)
    t0 = time.time() - 1000.0
    table_runs.begin_attempt(run_dir, now=t0)
    written = run_dir / "run" / "checkpoints" / "10"
    written.parent.mkdir(parents=True)
    written.write_text("step 10")
    os.utime(written, (t0 + 100.0, t0 + 100.0))  # its last write; then kill -9
    ctx = harness.Context(tmp_path, tmp_path / "sft", smoke=False, log=lambda *a: None)
    row = table_runs.run_one(table, table.arms[0], 0, ctx)
    assert row["status"] == "ok" and row["processes"] == 2
    assert 100.0 <= row["wall_s"] < 160.0, row["wall_s"]
    assert json.loads((run_dir / "result.json").read_text())["wall_s"] == row["wall_s"]


def test_a_finished_run_of_another_config_is_an_error_not_a_result(tmp_path, capsys):
    """A rerun reuses finished runs only when their config is the one asked for: a changed
    arm (here its value; in a table, a learning rate tuned again) stops the table."""
    table = _table(Arm("a", lambda c: c), Arm("b", lambda c: c))
    args = ["--workdir", str(tmp_path), "--seeds", "1"]
    assert table_cli.main(table, args) == 0
    changed = _table(Arm("a", lambda c: c), Arm("b", lambda c: dataclasses.replace(c, value=0.7)))
    assert table_cli.main(table, args) == 0  # the same config: reused
    assert table_cli.main(changed, args) == 1
    assert "holds a finished run of another config" in capsys.readouterr().err
    shutil.rmtree(tmp_path / "runs" / "b" / "seed0")  # the fix the message names
    assert table_cli.main(changed, args) == 0
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert {r["arm"]: r["metrics"]["m"] for r in rows} == {"a": 0.5, "b": 0.7}


def test_diverged_runs_are_rows_and_every_output_has_provenance(tmp_path):
    nan = lambda c: dataclasses.replace(c, value=math.nan)  # noqa: E731
    table = _table(Arm("a", lambda c: c), Arm("nan", nan), Arm("b", lambda c: c))
    assert table_cli.main(table, ["--workdir", str(tmp_path), "--seeds", "2"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [(r["arm"], r["status"]) for r in rows] == [
        ("a", "ok"),
        ("nan", "diverged"),
        ("b", "ok"),
    ] * 2
    assert rows[1]["error"] == "loss is not finite at RL step 3"
    assert all(r["provenance"]["commit"] == rows[0]["provenance"]["commit"] for r in rows)
    text = (tmp_path / "t.md").read_text()
    # with its reason: a FloatingPointError from a bug reads as one
    reason = "loss is not finite at RL step 3"
    assert f"Diverged: nan (seed 0: {reason}), nan (seed 1: {reason})" in text
    assert "each directional claim is a one-sided paired t-test at 2.5%" in text
    assert f"Written at commit {rows[0]['provenance']['commit']}" in text
    written = json.loads((tmp_path / "t.claims.json").read_text())
    assert written["provenance"]["versions"] == rows[0]["provenance"]["versions"]
    (j,) = written["claims"]  # b - a = 0 on both seeds: no spread, no effect
    assert j["seeds"] == 2 and j["p"] == 1.0 and j["p_holm"] == 1.0
    assert j["verdict"] == claims.no_effect(0.03)


# ------------------------------------------------------------------------------- tuning


SEEN = []  # (arm, seed, split, lr) of every run the tuning table's execute trained


def _tuned_execute(table, arm, seed, run_dir, ctx):
    """A stand-in run whose validation/test score peaks at lr = 10**-3.3 (~5e-4) for arm
    "a" and at 10**-2.7 (~2e-3) for arm "b", plus a little per seed."""
    cfg = harness.arm_config(table, arm, seed, ctx)
    lr, split = cfg.optimizer.learning_rate, cfg.eval.split
    SEEN.append((arm.name, seed, split, lr))
    best = -3.3 if arm.name == "a" else -2.7
    score = 0.5 - (math.log10(lr) - best) ** 2 + 0.001 * seed
    return {"max@1": score, "objective": score, "lr": lr}


def _tuning_table(grid=(2.5e-4, 5e-4, 1e-3, 2e-3)):
    base = TrainConfig(task=ArithConfig(validation_size=20))
    passk = lambda c: dataclasses.replace(c, objective=ObjectiveConfig(Objective.MAX_AT_K, k=8))  # noqa: E731
    return harness.Table(
        "tt",
        "tt",
        (Arm("a", lambda c: c), Arm("b", passk)),
        (Claim("1", "b beats a", "max@1", "b", "a"),),
        (("max@1", "max@1"),),
        lambda seed, smoke: base,
        "b",
        execute=_tuned_execute,
        plot=lambda *a: None,
        tuning=tuning.Tuning(grid=grid, seeds=(1000, 1001)),
    )


def test_tuning_picks_each_arms_rate_on_validation_and_tuning_seeds_only(tmp_path):
    SEEN.clear()
    table = _tuning_table()
    assert table_cli.main(table, ["--workdir", str(tmp_path), "--seeds", "2"]) == 0
    tuned = [s for s in SEEN if s[2] is EvalSplit.VALIDATION]
    reported = [s for s in SEEN if s[2] is EvalSplit.TEST]
    assert {seed for _, seed, _, _ in tuned} == {1000, 1001}  # never a reported seed
    assert len(tuned) == 2 * 4 * 2  # arms x grid x tuning seeds
    assert {seed for _, seed, _, _ in reported} == {0, 1}
    assert {(arm, lr) for arm, _, _, lr in reported} == {("a", 5e-4), ("b", 2e-3)}
    written = json.loads((tmp_path / "tt.claims.json").read_text())["tuning"]
    assert {c["metric"] for c in written["chosen"].values()} == {"objective"}
    assert [written["chosen"][a]["lr"] for a in "ab"] == [5e-4, 2e-3]
    tuning_rows = (tmp_path / "tt.tuning.jsonl").read_text().splitlines()
    assert len(tuning_rows) == 16 and all('"lr"' in r for r in tuning_rows)
    assert "| a | objective |" in (tmp_path / "tt.md").read_text()
    assert "would tell): b (largest)." in (tmp_path / "tt.md").read_text()  # 2e-3 ends the grid
    SEEN.clear()  # a rerun finds every run finished: nothing trains again
    assert table_cli.main(table, ["--workdir", str(tmp_path), "--seeds", "2"]) == 0
    assert SEEN == []


def test_tuning_rules():
    assert tuning.choose([1e-4, 1e-3], [0.5, 0.5]) == 1e-4  # a tie: the gentler rate
    assert tuning.score([{"status": "diverged", "metrics": {}}], "max@1") == -math.inf
    with pytest.raises(ValueError, match="every learning rate"):
        tuning.choose([1e-4], [-math.inf])
    with pytest.raises(ValueError, match="validation_size"):
        tuning.for_tuning(TrainConfig(), 1e-3)
    with pytest.raises(ValueError, match=">= 100"):
        tuning.Tuning(grid=(1e-3,), seeds=(0, 1))  # a reported seed
    grid = [1e-3, 2.5e-4, 5e-4]  # in any order
    chosen = {
        a: {"grid": grid, "lr": lr} for a, lr in (("lo", 2.5e-4), ("mid", 5e-4), ("hi", 1e-3))
    }
    assert tuning.at_edge(chosen) == {"lo": "smallest", "hi": "largest"}
    assert tuning.at_edge({"two": {"grid": [1e-4, 1e-3], "lr": 1e-3}}) == {}  # every rate is an end
    assert "hi (largest)" in tuning.edge_note(chosen) and "mid" not in tuning.edge_note(chosen)
    assert tuning.edge_note({"mid": chosen["mid"]}) == "Chosen at an end of the grid: none."


def test_a_claim_without_an_equivalence_margin_is_never_a_null_result():
    rows = rows_of({"a": [0.1, 0.1, 0.1, 0.1]})
    j = claims.judge(rows, Claim("x", "", "m", "a", None, equivalence_margin=None))
    assert math.isnan(j["p_equivalent"]) and j["seeds_for_mde"] is None
    assert j["verdict"] == claims.REPRODUCED  # 0.1 on every seed: clearly above 0
    rows = rows_of({"a": np.zeros(4)})
    j = claims.judge(rows, Claim("x", "", "m", "a", None, equivalence_margin=None))
    assert j["verdict"] == claims.INCONCLUSIVE  # with a margin it would be "no effect > m"


def test_from_rows_rejudges_a_finished_table_without_training(tmp_path):
    table = _table(Arm("a", lambda c: c), Arm("b", lambda c: c))
    assert table_cli.main(table, ["--workdir", str(tmp_path / "run"), "--seeds", "3"]) == 0
    rows = (tmp_path / "run" / "t.jsonl").read_text().splitlines()
    bare = [json.dumps({k: v for k, v in json.loads(r).items() if k != "provenance"}) for r in rows]
    (tmp_path / "old.jsonl").write_text("\n".join(bare) + "\n")
    out = tmp_path / "again"
    argv = ["--workdir", str(out), "--from_rows", str(tmp_path / "old.jsonl")]
    assert table_cli.main(table, argv) == 0
    assert not (out / "runs").exists()  # nothing trained
    judged = json.loads((out / "t.claims.json").read_text())["claims"]
    assert judged == json.loads((tmp_path / "run" / "t.claims.json").read_text())["claims"]
    assert "6 of 6 rows carry no provenance" in (out / "t.md").read_text()
    argv = ["--workdir", str(out), "--from_rows", str(tmp_path / "missing.jsonl")]
    assert table_cli.main(table, argv) == 2  # a bad file is a usage error (table_cli's doc)


def test_arms_and_learning_rates_rerun_part_of_a_tuned_table(tmp_path, capsys):
    table = _tuning_table()
    assert table_cli.main(table, ["--workdir", str(tmp_path / "full"), "--seeds", "2"]) == 0
    rates = str(tmp_path / "full" / "tt.claims.json")
    SEEN.clear()
    argv = ["--workdir", str(tmp_path / "part"), "--seeds", "2", "--arms", "b"]
    assert table_cli.main(table, [*argv, "--learning_rates", rates]) == 0
    assert {(arm, seed, lr) for arm, seed, _, lr in SEEN} == {("b", 0, 2e-3), ("b", 1, 2e-3)}
    assert not (tmp_path / "part" / "tuning").exists()  # the rates were not tuned again
    assert table_cli.main(table, [*argv[:4], "--arms", "c"]) == 2
    assert "--arms: ['c'] are not arms of tt" in capsys.readouterr().err
    missing = str(tmp_path / "none.json")
    assert table_cli.main(table, [*argv, "--learning_rates", missing]) == 2


def test_arms_may_hold_commas_or_be_given_by_slug(capsys):
    table = _table(Arm("3 epochs, exact", lambda c: c), Arm("1 epoch", lambda c: c))
    both = ["3 epochs, exact", "1 epoch"]
    assert table_cli.arm_names(table, "3 epochs, exact,1 epoch") == both
    assert table_cli.arm_names(table, "3_epochs_exact, 1 epoch") == both
    assert table_cli.arm_names(table, "1 epoch") == ["1 epoch"]
    assert table_cli.arm_names(table, "3 epochs,x") == ["3 epochs", "x"]
    with pytest.raises(ValueError, match=r"\['3 epochs', 'x'\] are not arms of t"):
        table_cli.only_arms(table, table_cli.arm_names(table, "3 epochs,x"))


def test_lockstep_flag_is_checked_and_skipped_for_a_table_with_its_own_execute(tmp_path, capsys):
    table = _table(Arm("a", lambda c: c), Arm("b", lambda c: c))
    args = ["--workdir", str(tmp_path), "--seeds", "2"]
    with pytest.raises(SystemExit) as e:
        table_cli.main(table, [*args, "--lockstep", "-1"])
    assert e.value.code == 2 and "--lockstep must be >= 0" in capsys.readouterr().err
    assert table_cli.main(table, [*args, "--lockstep", "2"]) == 0
    assert "--lockstep does not apply: this table runs its own execute" in capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all("lockstep_seeds" not in r for r in rows)


def test_reuse_runs_takes_identical_runs_of_another_table_and_trains_the_rest(tmp_path, capsys):
    """--reuse_runs: a run (tuning or reported) whose whole config matches a finished run of
    another table takes that row; any difference (another arm, another warm-start folder)
    trains. Here "a2" is "a" under another name, "c" is new."""
    SEEN.clear()
    first, sft = tmp_path / "first", str(tmp_path / "sft")
    assert (
        table_cli.main(_tuning_table(), ["--workdir", str(first), "--seeds=2", f"--sft_dir={sft}"])
        == 0
    )
    half = lambda c: dataclasses.replace(c, objective=ObjectiveConfig(Objective.MAX_AT_K, k=4))  # noqa: E731
    other = dataclasses.replace(
        _tuning_table(),
        name="other",
        arms=(Arm("a2", lambda c: c), Arm("c", half)),
        claims=(Claim("1", "c beats a2", "max@1", "c", "a2"),),
    )
    SEEN.clear()
    args = ["--workdir", str(tmp_path / "second"), "--seeds=2", f"--sft_dir={sft}"]
    assert table_cli.main(other, [*args, f"--reuse_runs={first}"]) == 0
    assert {arm for arm, *_ in SEEN} == {"c"} and len(SEEN) == 4 * 2 + 2  # grid x tuning + seeds
    rows = {
        (r["arm"], r["seed"]): r
        for r in map(json.loads, (tmp_path / "second" / "other.jsonl").read_text().splitlines())
    }
    mine = {
        (r["arm"], r["seed"]): r
        for r in map(json.loads, (first / "tt.jsonl").read_text().splitlines())
    }
    for seed in (0, 1):
        assert rows["a2", seed]["metrics"] == mine["a", seed]["metrics"]
        assert rows["a2", seed]["config_sha"] == mine["a", seed]["config_sha"]
        assert rows["a2", seed]["reused_from"].startswith(str(first))
        assert "reused_from" not in rows["c", seed]
    SEEN.clear()  # another warm-start folder is another config: everything trains
    elsewhere = ["--workdir", str(tmp_path / "third"), "--seeds=2", f"--reuse_runs={first}"]
    assert table_cli.main(other, elsewhere) == 0
    assert {arm for arm, *_ in SEEN} == {"a2", "c"}
    assert table_cli.main(other, [*args, f"--reuse_runs={tmp_path / 'nowhere'}"]) == 2
    assert "--reuse_runs: no such folder" in capsys.readouterr().err


def test_warm_starts_of_two_rewards_of_one_task_get_two_folders(tmp_path):
    """A warm start records its task, so Countdown's exact-hit tables (1, 2) and its
    near-miss table (3) sharing one --sft_dir must not share a folder; a kind's default
    reward keeps the plain name."""
    from experiments.configs import tiny_arith, tiny_countdown

    def folder(cfg):
        return pathlib.Path(harness.with_seed(cfg, 0, tmp_path).sft.cache_dir).name

    assert folder(tiny_countdown.BASE) == "countdown_seed0"
    assert folder(tiny_countdown.EXACT_BASE) == "countdown_exact_seed0"
    assert folder(tiny_arith.BASE) == "arith_seed0"


def test_fingerprint_leaves_out_a_later_field_at_its_default():
    """Rows fingerprinted before sampler_compact_floor, sampler_weights, rl.pack,
    rl.sequence_parallel, model.attention, model.lora and objective.bon_anchor(_samples)
    stay reusable (the hash
    without them); setting any changes the hash."""
    import hashlib

    from kjax.lora_config import LoraConfig
    from kjax.models.config import AttentionBackend
    from kjax.rl.step_config import PackMode

    cfg = TrainConfig()
    fields = dataclasses.asdict(cfg)
    del fields["sampler_compact_floor"], fields["rl"]["pack"], fields["model"]["attention"]
    del fields["sampler_weights"], fields["model"]["lora"], fields["objective"]["bon_anchor"]
    del fields["objective"]["bon_anchor_samples"], fields["rl"]["sequence_parallel"]
    before = hashlib.sha256(json.dumps(fields, default=str, sort_keys=True).encode()).hexdigest()
    assert harness.fingerprint(cfg) == before[:16]
    for on in (
        dataclasses.replace(cfg, sampler_compact_floor=4),
        dataclasses.replace(cfg, sampler_weights="tensor"),
        dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, pack=PackMode.GROUP)),
        dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, sequence_parallel=True)),
        dataclasses.replace(
            cfg, model=dataclasses.replace(cfg.model, attention=AttentionBackend.SPLASH)
        ),
        dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora=LoraConfig(rank=4))),
        dataclasses.replace(
            cfg,
            objective=ObjectiveConfig(
                Objective.BON_DISTILL, k=4, bon_anchor=BonAnchor.REFERENCE, bon_anchor_samples=4
            ),  # fmt: skip
        ),
    ):
        assert harness.fingerprint(on) != harness.fingerprint(cfg)


def test_rows_from_before_the_lag_and_sampler_device_fields_still_match(tmp_path):
    """Tables 1-3 and 10b's committed rows were fingerprinted before mesh.sampler_devices,
    rl.policy_lag and rl.lag_correction existed: at those fields' defaults a row hashed
    without them matches (table_runs.matches), one hashed with them still does, and a
    lagged config does not match the older row."""
    import hashlib

    from experiments.lab import table_runs

    cfg = TrainConfig()
    fields = dataclasses.asdict(cfg)
    harness._drop_later_defaults(fields)
    del (
        fields["mesh"]["sampler_devices"],
        fields["rl"]["policy_lag"],
        fields["rl"]["lag_correction"],
    )
    old = hashlib.sha256(json.dumps(fields, default=str, sort_keys=True).encode()).hexdigest()
    assert table_runs.matches(old[:16], cfg, tmp_path)
    assert table_runs.matches(harness.fingerprint(cfg, tmp_path), cfg, tmp_path)
    lagged = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, policy_lag=1))
    assert not table_runs.matches(old[:16], lagged, tmp_path)


def test_the_report_names_the_commits_that_trained_its_rows():
    from experiments.lab.report import commits_note

    row = {"provenance": {"commit": "5b8ae190bceda4f5"}}
    assert commits_note([row, row]) == "Rows trained at commit 5b8ae19 (2 rows)."
    other = {"provenance": {"commit": "abf1257aaaa"}}
    assert commits_note([row, other]) == (
        "Rows trained at commit 5b8ae19 (1 row), abf1257 (1 row); rows of 2 commits: not one code."
    )
    assert commits_note([{"seed": 0}]) == ""
