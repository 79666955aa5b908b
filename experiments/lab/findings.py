"""README's findings table: one row per claim of every paper table, built from the claims
each table module declares and the verdicts its committed run judged
(experiments/results/NAME.claims.json). A row shows the claim in a few words (SHORT); its
full text, with the paper's numbers, is on the table's page one link away.

    python -m experiments.lab.findings           # print the table
    python -m experiments.lab.findings --write   # and write experiments/results/findings.md

A claim declared but not yet run (a new table, or a claim added after its run) gets the row
"not run yet", never a number. tests/experiments/test_tables.py checks that README's table is
this module's output for the committed files.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import re
import sys

from experiments.lab import harness
from experiments.lab.claims import fmt
from kjax.files import write_atomic

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"
OUT = RESULTS / "findings.md"


@dataclasses.dataclass(frozen=True)
class Source:
    """A table: its number, heading (the papers it tests and its task), result stem (= its
    module in experiments/tables/), detail page, and whether the module declares a TABLE
    (False: a page its own script writes)."""

    number: int
    heading: str
    stem: str
    page: str
    declared: bool = True


COUNTDOWN, NEAR_MISS = "Countdown, exact hit", "Countdown, near-miss reward"
TABLES = (
    Source(1, f"Tang et al. 2025 · {COUNTDOWN}", "tang2025_table", "docs/tables/tang2025.md"),
    Source(
        2,
        f"PKPO (Walder & Karkhanis 2025): k_opt in training · {COUNTDOWN}",
        "pkpo_kopt_table",
        "docs/tables/pkpo_kopt.md",
    ),
    Source(
        3,
        f"Bagirov et al. 2025: max@k in PPO epochs · {NEAR_MISS}",
        "maxk_offpolicy_table",
        "docs/tables/maxk_offpolicy.md",
    ),
    Source(
        4,
        "DCO (Chen, Raventos et al. 2025): SFT epochs · arithmetic",
        "dco_sft_table",
        "docs/tables/dco_sft.md",
    ),
    Source(
        5,
        "PKPO's toy: the max@k-optimal Gaussian policy · exact",
        "pkpo_toy_figure",
        "docs/tables/pkpo_toy.md",
        declared=False,
    ),
    Source(
        6,
        f"L2O (Takashiro et al. 2026), MaxRL (Tajwar, Zeng et al. 2026) · {COUNTDOWN}",
        "estimators_2026_table",
        "docs/tables/estimators_2026.md",
    ),
    Source(
        7,
        "Tang et al. 2025 on SmolLM2-135M-Instruct, LoRA · arithmetic, 18 seeds, 18 CPU h",
        "smollm2_lora_passk",
        "docs/tables/smollm2_lora_passk.md",
    ),
    Source(8, "TTRL (Zuo et al. 2025) · arithmetic", "ttrl_table", "docs/tables/ttrl.md"),
    Source(
        10,
        f"Best-of-8 distillation (vBoN: Amini et al. 2024) · {NEAR_MISS}",
        "bon_distill_table",
        "docs/tables/bon_distill.md",
    ),
    Source(
        10,
        "Reward-KL front (vBoN) · as table 10",
        "bon_frontier_table",
        "docs/tables/bon_frontier.md",
    ),
    Source(
        11,
        f"Async RL, policy lag x correction (NeMo-RL, verl) · {COUNTDOWN}",
        "async_lag_table",
        "docs/async.md",
    ),
)

# README's wording of each claim: the paper's claim in a few words (the source is the
# table's heading), "kjax:" for a comparison the paper does not make, "post hoc" for a claim
# written or changed after its rows were seen. The full text is on the table's page. A claim
# without an entry shows its full text.
SHORT = {
    "1a": "pass@k objective (LOO, N=k) beats mean objective on pass@k, PG",
    "1b": "... and loses pass@1",
    "1c": "biased (centred) variant beats mean objective on pass@k, PPO",
    "1d": "kjax: biased variant beats unbiased LOO at N=k, PPO",
    "1e": "kjax: biased variant beats LOO-1 at N=16, PPO",
    "1f": "majority objective below mean objective on held-out maj@k, PG (direction post hoc)",
    "1g": "testbed premise, not a paper claim: mean-RL lowers pass@16 below warm start",
    "2a": "k_opt = 8 beats k_opt = 1 on pass@16",
    "2b": "... and loses pass@1",
    "2c": "kjax: k_opt = 16 beats k_opt = 1 on pass@16",
    "2d": "kjax: annealing beats k_opt = 8 on pass@1",
    "2e": "annealing 8 -> 1 beats k_opt = 1 on pass@16 (post hoc)",
    "2e.2": "... on pass@2 (post hoc)",
    "2e.4": "... on pass@4 (post hoc)",
    "2e.8": "... on pass@8 (post hoc)",
    "2d'": "... no sacrifice in pass@1: margin 0 (post hoc; was kjax's margin 0.02)",
    "2e'": "kjax: annealing's pass@16 within 0.02 of k_opt = 8 (kjax's margin, post hoc)",
    "3a": "first-order off-policy max@k update beats fixed advantages",
    "3b": "kjax: exact re-weighting beats fixed advantages",
    "3c": "kjax: 3 re-weighted epochs beat 1 at equal samples",
    "4a": "more CE SFT lowers pass@256 (since warm start: post hoc)",
    "4b": "DCO holds pass@256 within 0.02 (kjax's margin; post hoc)",
    "4c": "DCO ends above cross-entropy on pass@256",
    "6a": "L2O: lower gradient variance than LOO-1",
    "6b": "... than LOO",
    "6c": "... than S",
    "6a'": "... than LOO-1, log ratio (post hoc)",
    "6b'": "... than LOO, log ratio (post hoc)",
    "6c'": "... than S, log ratio (post hoc)",
    "6d": "kjax: L2O at most 0.02 below LOO-1 on pass@8",
    "6e": "kjax: ... on pass@16",
    "6d'": "L2O beats non-centred LOO-1 on pass@8 (post hoc)",
    "6e'": "... on pass@16 (post hoc)",
    "6f": "MaxRL's pass@1 at most 0.02 below mean objective's (kjax's margin, post hoc; "
    "vs GRPO there)",
    "6g": "MaxRL beats the mean objective on pass@16",
    "7a": "pass@k objective beats mean objective on pass@k (seeds post hoc)",
    "7b": "... and loses pass@1 (seeds post hoc)",
    "8a": "label-free RL raises pass@1 over the warm start",
    "11a": "one step stale, IS-corrected = on-policy, mean objective (NeMo-RL; kjax's "
    "margin 0.02; post hoc)",
    "11b": "... uncorrected (verl; kjax's margin; post hoc)",
    "11c": "kjax: pass@8 one step stale, exact correction, within 0.02 of on-policy (so is "
    "NONE: 11e)",
    "11d": "kjax: ... two steps stale (so is NONE: 11f)",
    "11e": "kjax: uncorrected, one step stale loses pass@8",
    "11f": "kjax: ... two steps stale",
    "11g": "kjax: two steps stale, exact correction beats TIS on pass@8",
    "8b": "TTRL's pass@1 passes the warm start's maj@16",
    "8c": "TTRL's pass@1 within 0.03 of supervised RL's (kjax's margin)",
    "8a'": "8a from a strong warm start (post hoc)",
    "8b'": "8b from a strong warm start (post hoc)",
    "8c'": "8c from a strong warm start (kjax's margin; post hoc)",
    "10a": "one sample within 0.05 of warm max@8 (kjax's margin; moving anchor)",
    "10c": "distillation raises mean reward (vBoN's premise; kjax's test)",
    "10b": "vBoN on the Pareto front more often than KL-penalty RL",
    "10b'": "... kjax's moving anchor",
    "10b.2": "kjax: moving anchor on/above mean-RL, n = 2 (kjax's margin)",
    "10b.4": "... n = 4",
    "10b.8": "... n = 8",
    "10b.16": "... n = 16",
}

HEAD = "| # | claim | paper's own number | kjax: diff [95% CI] | verdict |\n|---|---|---|---|---|"


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "/").split())


def _verdict(verdict: str) -> str:
    """The verdict in fewer words: every label but "reproduced" starts "not reproduced: ",
    left out here; "no effect larger than m (kjax's margin)" is "no effect > m" (README
    says m is kjax's: a claim with the paper's effect is judged against that instead)."""
    short = verdict.removeprefix("not reproduced: ").replace(" (kjax's margin)", "")
    return _cell(short.replace("no effect larger than", "no effect >"))


def _paper(claim) -> str:
    """The paper's own number for the claim (Claim.paper_number), "kjax's claim" for a
    "-" where the paper gives no number or the claim is kjax's."""
    if claim.paper_number:
        return _cell(claim.paper_number)
    return "-"


def _header(source: Source) -> str:
    """The row that opens a table's claims: its number, linked to its page, and heading."""
    return f"| **[{source.number}]({source.page})** | **{source.heading}** | | | |"


def _rows_of_page(source: Source) -> list[str]:
    """A table written by its own script (its Markdown has `| id | paper | verdict |` rows):
    the claim and verdict as written, no interval."""
    text = (RESULTS / f"{source.stem}.md").read_text()
    rows = [_header(source)]
    for line in text.splitlines():
        m = re.match(rf"\| ({source.number}[a-z]'?) \| (.*) \| (.*) \|$", line)
        if m:
            claim, paper, verdict = m.groups()
            exact = re.fullmatch(r"(.+) \(exact: (.+)\)", verdict)  # the numbers: the diff
            diff, verdict = (exact[2], f"{exact[1]} (exact)") if exact else ("exact", verdict)
            row = f"| {claim} | {SHORT.get(claim, paper)} | - | {diff} | {verdict} |"
            rows.append(row)
    return rows


def rows_of(source: Source) -> list[str]:
    """The findings rows of one table: its header, then its claims in declared order."""
    if not source.declared:
        return _rows_of_page(source)
    table = harness.load_table(source.stem)
    path = RESULTS / f"{source.stem}.claims.json"
    judged = {}
    if path.exists():
        judged = {c["claim"]: c for c in json.loads(path.read_text())["claims"]}
    rows = [_header(source)]
    previous = None
    for claim in table.claims:
        j = judged.get(claim.id)
        text = SHORT.get(claim.id, claim.text)
        if j is None:
            diff, verdict = "-", "not run yet"
        else:
            bounds = [math.nan if j[x] is None else j[x] for x in ("mean", "low", "high")]
            # named once: not when the text names it, nor on a "..." row (as above) whose
            # metric the row above named
            same = text.startswith("...") and previous == claim.metric
            metric = "" if claim.metric in text or same else f" {claim.metric}"
            diff = f"{fmt(*bounds)}{metric}"
            verdict = _verdict(j["verdict"])
        previous = claim.metric
        rows.append(f"| {claim.id} | {_cell(text)} | {_paper(claim)} | {diff} | {verdict} |")
    return rows


def findings() -> str:
    """The whole table (Markdown, no trailing newline)."""
    return "\n".join([HEAD] + [row for source in TABLES for row in rows_of(source)])


def main(argv: list[str]) -> int:
    if any(a not in ("--write",) for a in argv):
        print(
            f"unknown flag(s) {argv}; usage: python -m experiments.lab.findings [--write]",
            file=sys.stderr,
        )
        return 2
    text = findings()
    print(text)
    if "--write" in argv:
        write_atomic(
            OUT,
            "Findings: one row per claim (generated by `python -m experiments.lab.findings "
            "--write` from each table's declared claims and committed claims.json).\n\n"
            + text
            + "\n",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
