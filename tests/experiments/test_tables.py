"""The paper-table modules: every one runs in --smoke mode, the harness's statistics and
verdicts follow their definitions, finished runs are skipped on resume, README's findings
table and the table pages are the committed result files verbatim, and notebook 02 runs on
smoke outputs."""

from __future__ import annotations

import importlib
import json
import math
import pathlib
import re
import shutil

import numpy as np
import pytest
from scipy import integrate, stats

from experiments.lab import claims, harness, report, table_cli
from experiments.lab.claims import Claim, ClaimKind

ROOT = pathlib.Path(__file__).parent.parent.parent
MODULES = ("pkpo_toy_figure", "pkpo_kopt_table", "tang2025_table", "maxk_offpolicy_table",
           "dco_sft_table", "estimators_2026_table", "smollm2_passk", "ttrl_table",
           "async_lag_table")  # fmt: skip


def _module(name: str):
    return importlib.import_module(f"experiments.tables.{name}")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """Every module's --smoke run into one directory, with one SFT warm start shared by all
    the tables (conftest's persistent compile cache serves the arms that compile the same
    step)."""
    root = tmp_path_factory.mktemp("tables")
    (root / "out").mkdir()
    for name in MODULES:  # each in its own workdir (arms of two tables may share a name)
        module = _module(name)
        args = ["--workdir", str(root / name), "--smoke"]
        if name == "pkpo_toy_figure":  # no RL, so no SFT warm start
            assert module.main(args) == 0
        else:
            assert table_cli.main(module.TABLE, [*args, "--sft_dir", str(root / "sft")]) == 0
        for suffix in ("md", "jsonl", "png"):
            shutil.copy(root / name / f"{name}.{suffix}", root / "out")
    return root


@pytest.mark.parametrize("name", MODULES)
def test_smoke_run_writes_table_figure_and_rows(smoke, name):
    out = smoke / "out"
    text = (out / f"{name}.md").read_text()
    assert (out / f"{name}.png").stat().st_size > 0
    rows = [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]
    if name == "pkpo_toy_figure":
        assert [r["k"] for r in rows] == list(_module(name).KS)
        return
    table = _module(name).TABLE
    assert sorted(r["arm"] for r in rows) == sorted(a.name for a in table.arms)
    trained = set(table.smoke_arms) or {a.name for a in table.arms}  # the rest: validated
    assert all(r["seed"] == 0 for r in rows)
    assert {r["arm"]: r["status"] for r in rows} == {
        a.name: "ok" if a.name in trained else report.SMOKE_SKIPPED for a in table.arms
    }
    for claim in table.claims:  # every claim gets a verdict line
        verdicts = claims.possible_verdicts(claim)
        assert re.search(rf"^\| {claim.id} \|.*\| ({'|'.join(map(re.escape, verdicts))}) \|$",
                         text, flags=re.M), claim.id  # fmt: skip


def test_resume_skips_finished_runs(smoke, monkeypatch):
    def must_not_run(*a, **k):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(harness, "rl_execute", must_not_run)
    module = _module("pkpo_kopt_table")
    workdir = smoke / "pkpo_kopt_table"
    before = (workdir / "pkpo_kopt_table.jsonl").read_text()
    args = ["--workdir", str(workdir), "--smoke", "--sft_dir", str(smoke / "sft")]
    assert table_cli.main(module.TABLE, args) == 0
    assert (workdir / "pkpo_kopt_table.jsonl").read_text() == before


def test_notebook_02_redraws_smoke_outputs(smoke, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("KJAX_RESULTS_DIR", str(smoke / "out"))
    nb = nbformat.read(ROOT / "notebooks" / "02_results.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT)}}).execute()  # fmt: skip
    printed = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "missing" not in printed.split("\n")[0], printed  # every table's file was found


# ------------------------------------------------------------------------- statistics


def test_t_interval_is_scipys_95_percent_student_interval():
    x = np.array([0.1, 0.35, 0.2, 0.05, 0.3])
    mean, low, high = claims.t_interval(x)
    ref = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    np.testing.assert_allclose([mean, low, high], [x.mean(), *ref], rtol=1e-12)
    assert math.isnan(claims.t_interval([0.3])[1])  # one seed: no interval


def _rows(values: dict[str, list[float | None]]) -> list[dict]:
    """Rows of arms x seeds; None marks a diverged run."""
    return [{"arm": arm, "seed": s, "status": "diverged" if v is None else "ok",
             "metrics": {} if v is None else {"m": v}}
            for arm, vs in values.items() for s, v in enumerate(vs)]  # fmt: skip


def test_claims_pair_by_seed_and_leave_diverged_runs_out():
    a = [0.50, 0.61, 0.40, None, 0.55]
    b = [0.45, 0.50, 0.38, 0.52, 0.41]
    rows = _rows({"a": a, "b": b})
    j = claims.judge(rows, Claim("x", "a beats b", "m", "a", "b"))
    diffs = [x - y for x, y in zip(a, b, strict=True) if x is not None]
    mean, low, high = claims.t_interval(diffs)
    assert j["seeds"] == 4 and j["mean"] == pytest.approx(mean) and j["low"] == pytest.approx(low)
    assert (j["verdict"] == claims.REPRODUCED) == (low > 0)  # one claim: its 95% interval
    table = report.arm_table(rows, ["a", "b"], [("m", "m")])
    assert "| 4 ok, 1 diverged |" in table  # reported, not dropped
    # Unpaired means would differ from the paired difference: pairing is by seed.
    one_sided = claims.judge(_rows({"a": a[:3], "b": b}), Claim("y", "", "m", "a", "b"))
    assert one_sided["seeds"] == 3


def test_against_zero_claim_uses_the_arms_own_values():
    rows = _rows({"a": [-0.2, -0.1, -0.15]})
    j = claims.judge(rows, Claim("z", "falls", "m", "a", None, ClaimKind.LESS))
    assert j["mean"] == pytest.approx(-0.15) and j["verdict"] == claims.REPRODUCED


# ------------------------------------------------------------------------ the toy, exactly


def test_toy_expected_max_matches_direct_integration():
    toy = _module("pkpo_toy_figure")
    theta, s = 0.7, toy.SIGMA
    density = lambda x: stats.norm.pdf(x, theta, s)  # noqa: E731
    mean, _ = integrate.quad(lambda x: x * x * density(x), 0.0, 1.0)  # k = 1: E[g(x)]
    assert toy.expected_max(theta, 1) == pytest.approx(mean, rel=1e-9)
    # k = 2: E[max] = int 2 g(x) F_g(g(x)) p(x) dx with F_g the reward's CDF.
    cdf = lambda x: stats.norm.cdf(x, theta, s) + stats.norm.sf(1.0, theta, s)  # noqa: E731
    two, _ = integrate.quad(lambda x: 2 * x * x * cdf(x) * density(x), 0.0, 1.0)
    assert toy.expected_max(theta, 2) == pytest.approx(two, rel=1e-8)


def test_toy_cli_offers_only_the_flags_it_reads(capsys):
    toy = _module("pkpo_toy_figure")
    with pytest.raises(SystemExit):
        toy.main(["--help"])
    assert set(re.findall(r"--\w+", capsys.readouterr().out)) == {"--help", "--workdir", "--smoke"}
    with pytest.raises(SystemExit):  # a table's flag is refused, not silently ignored
        toy.main(["--workdir", "unused", "--seeds", "5"])


def test_toy_optimum_is_a_stationary_maximum():
    toy = _module("pkpo_toy_figure")
    for k in (1, 8):
        t, h = toy.optimal_theta(k), 1e-4
        assert toy.expected_max(t, k) >= max(toy.expected_max(t - h, k), toy.expected_max(t + h, k))


# ----------------------------------------------------------------------------- README


PROSE_TABLES = ("| objective | functions | papers |",)


def test_readme_findings_are_the_generated_table():
    """README's findings table is experiments.lab.findings' output for the committed claims
    files, and experiments/results/findings.md is that output too."""
    findings = importlib.import_module("experiments.lab.findings")
    readme = (ROOT / "README.md").read_text()
    table = findings.findings()
    assert table in _tables(readme), (
        "README's findings table is stale: run experiments.lab.findings"
    )
    assert table in _tables(findings.OUT.read_text()), (
        "run python -m experiments.lab.findings --write"
    )


def test_every_claims_file_has_a_findings_entry_and_a_page():
    findings = importlib.import_module("experiments.lab.findings")
    stems = {s.stem for s in findings.TABLES}
    for path in (ROOT / "experiments" / "results").glob("*.claims.json"):
        assert path.name.removesuffix(".claims.json") in stems, f"{path.name} not in findings"
    for source in findings.TABLES:
        assert (ROOT / source.page).exists(), source.page


# What a claim's README wording must keep of its full text: whose claim it is, and whether
# it was set after its rows were seen.
_MARKS = (
    (re.compile(r"kjax, not the paper"), re.compile(r"^kjax: ")),
    (re.compile(r"kjax's margin"), re.compile(r"kjax's margin")),
    (re.compile(r"not a paper"), re.compile(r"not a paper")),
    (re.compile(r"added after|rows were seen|turned after"), re.compile(r"post hoc")),
)


def test_findings_wording_keeps_whose_claim_and_when():
    """SHORT words only declared claims, and keeps each claim's "kjax, not the paper",
    "kjax's margin" and after-the-data marks (the full text is on the table's page)."""
    findings = importlib.import_module("experiments.lab.findings")
    declared = {
        c.id: c.text for s in findings.TABLES if s.declared for c in _module(s.stem).TABLE.claims
    }
    assert set(findings.SHORT) <= set(declared), set(findings.SHORT) - set(declared)
    for claim, short in findings.SHORT.items():
        for in_full, in_short in _MARKS:
            if in_full.search(declared[claim]):
                assert in_short.search(short), (claim, in_short.pattern, short)


def test_table_pages_show_the_committed_result_files():
    """Each table's page holds every Markdown table its command wrote, and every table on
    the pages (and README) is in a committed result file: nothing shown that no command
    wrote."""
    findings = importlib.import_module("experiments.lab.findings")
    results = ROOT / "experiments" / "results"
    tables_in_files = set()
    for path in results.rglob("*.md"):
        tables_in_files.update(_tables(path.read_text()))
    for source in findings.TABLES:
        page = (ROOT / source.page).read_text()
        for block in _tables((results / f"{source.stem}.md").read_text()):
            assert block in page, f"{source.page} lacks this table of {source.stem}.md:\n{block}"
    pages = sorted((ROOT / "docs" / "tables").glob("*.md")) + [ROOT / "README.md"]
    for page in pages:
        for block in _tables(page.read_text()):
            if block.startswith(PROSE_TABLES):  # README's list of functions
                continue
            assert block in tables_in_files, (
                f"{page.name}: table not in experiments/results/:\n{block}"
            )


def _tables(text: str) -> list[str]:
    """Markdown tables: maximal runs of lines starting with '|'."""
    blocks, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            blocks.append("\n".join(current))
            current = []
    return blocks


def test_from_rows_rewrites_a_committed_tuned_table_but_its_provenance(tmp_path):
    """--from_rows on a committed table judges its rows again and keeps its learning-rate
    section (the chosen rates and tuning rows beside the rows file): the page comes back
    the same but for the line naming the writer's commit."""
    module = _module("pkpo_kopt_table")
    results = ROOT / "experiments" / "results"
    args = ["--workdir", str(tmp_path), "--from_rows", str(results / "pkpo_kopt_table.jsonl")]
    assert table_cli.main(module.TABLE, args) == 0

    def page(path):
        return [x for x in path.read_text().splitlines() if not x.startswith("Written at commit")]

    assert page(tmp_path / "pkpo_kopt_table.md") == page(results / "pkpo_kopt_table.md")
    assert "Learning rates (tuning seeds" in (tmp_path / "pkpo_kopt_table.md").read_text()
