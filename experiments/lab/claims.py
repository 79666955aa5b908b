"""Claims about paired differences over seeds, and how a table judges them.

Statistics. Per arm: mean and 95% Student-t interval over seeds. Per claim: the paired
differences d_s = metric(arm, s) - metric(baseline, s) (same seed, same warm start) and
their 95% two-sided t-interval, i.e. each directional claim is a one-sided paired t-test at
2.5% (GREATER: H1 mean d > 0; LESS: mean d < 0; NONINFERIOR: mean d > -margin). An
EQUIVALENT claim is two one-sided tests (TOST) at 5%, p the larger of the two (the 90%
interval inside [-margin, margin]).

Multiplicity: Holm, in three families, each over all of a table's claims (the report names
them): (1) the claims' own tests; (2) the tests of the opposite (GREATER/LESS: the other
direction; NONINFERIOR: worse than -margin; EQUIVALENT: outside the margin, either side);
(3) the bounding tests: where the claim carries the paper's own effect e (paper_effect), the
one-sided test that d lies on the near side of e (GREATER: d < e; LESS: d > e), else TOST
within kjax's equivalence_margin m. Each family's error is controlled at its own level; the
three are not adjusted against each other.

Verdicts (first that applies), each saying what the interval shows:
  reproduced                                    family 1 below alpha.
  not reproduced: opposite direction            family 2 below alpha (GREATER/LESS);
  not reproduced: worse than the margin         ... NONINFERIOR;
  not reproduced: outside the margin            ... EQUIVALENT.
  not reproduced: excludes the paper's effect (e)   family 3 below 0.025, a paper effect.
  not reproduced: <one of the three above> (before Holm only)   the opposite's raw p below
                                                alpha but not its Holm p: the interval lies
                                                beyond the margin, never labelled "no effect".
  not reproduced: no effect larger than m (kjax's margin)   family 3's TOST below 0.05; only
                                                for claims without a paper effect, so m is
                                                never printed where the paper's effect is
                                                smaller than m.
  not reproduced: inconclusive                  none of these.
MDE (80%): (t_{0.975,n-1} + t_{0.8,n-1}) sd(d) / sqrt(n), the true difference a one-sided
2.5% test detects with 80% power at the observed paired sd (before the Holm correction).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Sequence

import numpy as np
from scipy import stats

REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced: inconclusive"
ALPHA = 0.025  # each directional claim: one side of the two-sided 95% interval
ALPHA_TOST = 0.05  # each of an equivalence's two one-sided tests: the 90% interval
TEST = (
    "Test: the paired 95% two-sided t-interval over seeds, i.e. each directional claim is a "
    "one-sided paired t-test at 2.5% (an equivalence: two one-sided tests at 5%). Holm, in "
    "three families each over all of this table's claims: the claims' own tests "
    "('reproduced': Holm p below 0.025, 0.05 for an equivalence); the tests of the opposite "
    "('opposite direction', 'worse than the margin', 'outside the margin'; '(before Holm "
    "only)' where only the unadjusted test passes); and the bounding tests: against the "
    "paper's own effect e where the claim has one ('excludes the paper's effect (e)': the "
    "one-sided test that the difference is on the near side of e, at 2.5%), else two "
    "one-sided tests at 5% within kjax's margin m ('no effect larger than m'). MDE (80%): "
    "the true difference a one-sided 2.5% test detects with 80% power at the observed "
    "paired sd."
)


def no_effect(margin: float) -> str:
    """The verdict of a claim without a paper effect whose difference is within +-margin."""
    return f"not reproduced: no effect larger than {margin:g} (kjax's margin)"


def below_paper(effect: float) -> str:
    """The verdict of a claim whose interval excludes the paper's own effect."""
    return f"not reproduced: excludes the paper's effect ({effect:+g})"


def opposite(kind: ClaimKind, before_holm: bool = False) -> str:
    """The verdict of a claim whose opposite test passes (before Holm only: unadjusted)."""
    what = {
        ClaimKind.GREATER: "opposite direction",
        ClaimKind.LESS: "opposite direction",
        ClaimKind.NONINFERIOR: "worse than the margin",
        ClaimKind.EQUIVALENT: "outside the margin",
    }[kind]
    return f"not reproduced: {what}" + (" (before Holm only)" if before_holm else "")


class ClaimKind(enum.Enum):
    GREATER = "greater"  # the paper: arm > baseline
    LESS = "less"  # the paper: arm < baseline
    EQUIVALENT = "equivalent"  # the paper: arm matches baseline (|diff| <= margin)
    NONINFERIOR = "noninferior"  # the paper: arm at least as good (diff >= -margin)


@dataclasses.dataclass(frozen=True)
class Claim:
    """One paired comparison: metric(arm) - metric(baseline) over the same seeds."""

    id: str
    text: str  # the paper's statement and numbers
    metric: str
    arm: str
    baseline: str | None  # None: the arm's own value against 0 (e.g. a change over epochs)
    kind: ClaimKind = ClaimKind.GREATER
    margin: float = 0.0  # EQUIVALENT: the interval within +- margin; NONINFERIOR: > -margin
    # A null result rules out effects larger than this; None: no such test (a metric whose
    # scale has no natural margin, e.g. a raw gradient variance that varies 10x by seed).
    # Read only for a claim without paper_effect.
    equivalence_margin: float | None = 0.03
    # The paper's own difference on this metric (its arm minus its baseline, as a rate), for
    # a GREATER (> 0) or LESS (< 0) claim that reports one; None: no such number.
    paper_effect: float | None = None
    # The paper's own number for this comparison as it reports it (model, task, metric),
    # shown beside kjax's in README's findings; "" where the paper gives none.
    paper_number: str = ""

    def __post_init__(self):
        e = self.paper_effect
        if e is None:
            return
        ok = (self.kind is ClaimKind.GREATER and e > 0) or (self.kind is ClaimKind.LESS and e < 0)
        if not ok:
            raise ValueError(
                f"claim {self.id}: paper_effect={e!r} needs a GREATER claim with e > 0 or a "
                f"LESS claim with e < 0; it is {self.kind.name}. Set paper_effect=None."
            )


def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high) of the 95% Student-t interval; low = high = nan for < 2 values."""
    x = np.asarray(values, float)
    if len(x) == 0:
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if len(x) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return mean, mean - half, mean + half


def p_greater(d: Sequence[float], delta: float = 0.0) -> float:
    """p of the one-sided paired t-test of H1: mean(d) > delta, d: [seeds] paired
    differences; nan for < 2 seeds. Zero spread: 0 if mean(d) > delta, else 1."""
    d = np.asarray(d, float)
    if len(d) < 2:
        return math.nan
    se, shift = d.std(ddof=1) / math.sqrt(len(d)), float(d.mean()) - delta
    if se == 0:
        return 0.0 if shift > 0 else 1.0
    return float(stats.t.sf(shift / se, len(d) - 1))


def p_less(d: Sequence[float], delta: float = 0.0) -> float:
    """p of the one-sided paired t-test of H1: mean(d) < delta."""
    return p_greater(-np.asarray(d, float), -delta)


def p_tost(d: Sequence[float], margin: float) -> float:
    """p of two one-sided tests of H1: -margin < mean(d) < margin, the larger of the two
    (below 0.05 exactly when the 90% t-interval lies inside [-margin, margin])."""
    return float(np.maximum(p_greater(d, -margin), p_less(d, margin)))


def claim_p(kind: ClaimKind, d: Sequence[float], margin: float = 0.0) -> tuple[float, float]:
    """(p of the claim, p of its opposite) on the paired differences d: [seeds]; compare
    each with alpha(kind)."""
    if kind is ClaimKind.GREATER:
        return p_greater(d), p_less(d)
    if kind is ClaimKind.LESS:
        return p_less(d), p_greater(d)
    if kind is ClaimKind.NONINFERIOR:  # the opposite: inferior by more than the margin
        return p_greater(d, -margin), p_less(d, -margin)
    # EQUIVALENT's opposite: outside the margin on either side, each side at alpha / 2.
    return p_tost(d, margin), float(
        np.minimum(1.0, 2 * np.minimum(p_greater(d, margin), p_less(d, -margin)))
    )


def alpha(kind: ClaimKind) -> float:
    return ALPHA_TOST if kind is ClaimKind.EQUIVALENT else ALPHA


def holm(p: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values: the i-th smallest of the m p's becomes
    max_{j <= i} min(1, (m - j + 1) p_(j)). nan (a claim without two seeds) stays nan and
    is not counted in m."""
    p = np.asarray(p, float)
    out = np.full_like(p, math.nan)
    tested = np.flatnonzero(~np.isnan(p))
    running = 0.0
    for i, j in enumerate(tested[np.argsort(p[tested], kind="stable")]):
        running = max(running, min(1.0, (len(tested) - i) * p[j]))
        out[j] = running
    return out


def mde(sd_diff: float, n_seeds: int, alpha: float = ALPHA, power: float = 0.8) -> float:
    """Minimum detectable effect of a one-sided paired t-test at level alpha with the given
    power: (t_{1-alpha,n-1} + t_{power,n-1}) sd_diff / sqrt(n); nan for < 2 seeds."""
    if n_seeds < 2 or not math.isfinite(sd_diff):
        return math.nan
    df = n_seeds - 1
    return float(
        (stats.t.ppf(1 - alpha, df) + stats.t.ppf(power, df)) * sd_diff / math.sqrt(n_seeds)
    )


def seeds_for_mde(sd_diff: float, target: float, alpha: float = ALPHA, power: float = 0.8) -> int:
    """The fewest seeds (>= 2) whose mde(sd_diff, n) is at most target (mde falls with n)."""
    if not (target > 0 and math.isfinite(sd_diff)):
        raise ValueError(f"seeds_for_mde needs target > 0 and a finite sd; got {target}, {sd_diff}")
    low, high = 1, 2  # mde(low) > target >= mde(high), low = 1 standing for "too few"
    while mde(sd_diff, high, alpha, power) > target:
        low, high = high, 2 * high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if mde(sd_diff, mid, alpha, power) > target else (low, mid)
    return high


def p_paper(kind: ClaimKind, d: Sequence[float], effect: float) -> float:
    """p of the one-sided test that the difference lies on the near side of the paper's
    effect (GREATER: mean d < effect; LESS: mean d > effect)."""
    return p_less(d, effect) if kind is ClaimKind.GREATER else p_greater(d, effect)


def verdict(
    kind: ClaimKind,
    p: float,
    p_opposite: float,
    p_bound: float = math.nan,
    equivalence_margin: float | None = 0.03,
    paper_effect: float | None = None,
    p_opposite_raw: float = math.nan,
) -> str:
    """The verdict from the Holm-adjusted p's of claim_p (p, p_opposite) and of the bounding
    test (p_bound: p_paper against paper_effect when given, else p_tost at
    equivalence_margin), and the unadjusted p_opposite_raw (module docstring)."""
    if p < alpha(kind):
        return REPRODUCED
    if p_opposite < alpha(kind):
        return opposite(kind)
    if paper_effect is not None and p_bound < ALPHA:
        return below_paper(paper_effect)
    if p_opposite_raw < alpha(kind):
        return opposite(kind, before_holm=True)
    if paper_effect is None and equivalence_margin is not None and p_bound < ALPHA_TOST:
        return no_effect(equivalence_margin)
    return INCONCLUSIVE


def possible_verdicts(c: Claim) -> tuple[str, ...]:
    """Every label verdict() can give claim c."""
    out = [REPRODUCED, opposite(c.kind), opposite(c.kind, before_holm=True), INCONCLUSIVE]
    if c.paper_effect is not None:
        out.append(below_paper(c.paper_effect))
    elif c.equivalence_margin is not None:
        out.append(no_effect(c.equivalence_margin))
    return tuple(out)


def values(rows: list[dict], arm: str, metric: str) -> dict[int, float]:
    """{seed: value} of the arm's finished runs."""
    return {r["seed"]: r["metrics"][metric] for r in rows
            if r["arm"] == arm and r["status"] == "ok" and metric in r["metrics"]}  # fmt: skip


def differences(rows: list[dict], claim: Claim) -> list[float]:
    """The claim's paired differences, [seeds where both arms finished]."""
    a = values(rows, claim.arm, claim.metric)
    b = values(rows, claim.baseline, claim.metric) if claim.baseline else dict.fromkeys(a, 0.0)
    return [a[s] - b[s] for s in sorted(set(a) & set(b))]


def judge_all(rows: list[dict], claims: Sequence[Claim]) -> list[dict]:
    """Every claim of a table, judged together: raw and Holm-adjusted p's, the 95% interval
    of the paired difference, its MDE (80%) and the verdict."""
    out = []
    for c in claims:
        d = differences(rows, c)
        mean, low, high = t_interval(d)
        sd = float(np.std(d, ddof=1)) if len(d) > 1 else math.nan
        p, p_opposite = claim_p(c.kind, d, c.margin)
        j = dict(claim=c.id, kind=c.kind.value, metric=c.metric, arm=c.arm, baseline=c.baseline)
        j.update(margin=c.margin, seeds=len(d), mean=mean, low=low, high=high, sd=sd)
        j.update(p=p, p_opposite=p_opposite, equivalence_margin=c.equivalence_margin)
        m, e = c.equivalence_margin, c.paper_effect
        j["p_equivalent"] = math.nan if m is None else p_tost(d, m)
        j["paper_effect"] = e
        j["p_paper"] = math.nan if e is None else p_paper(c.kind, d, e)
        j["p_bound"] = j["p_paper"] if e is not None else j["p_equivalent"]
        j["mde"] = mde(sd, len(d))
        j["seeds_for_mde"] = seeds_for_mde(sd, m) if len(d) > 1 and m is not None else None
        out.append(j)
    for key in ("p", "p_opposite", "p_bound"):  # the three Holm families
        for j, adjusted in zip(out, holm([j[key] for j in out]), strict=True):
            j[f"{key}_holm"] = float(adjusted)
    for c, j in zip(claims, out, strict=True):
        p_holm = (j["p_holm"], j["p_opposite_holm"], j["p_bound_holm"])
        j["verdict"] = verdict(
            c.kind, *p_holm, c.equivalence_margin, c.paper_effect, j["p_opposite"]
        )
    return out


def judge(rows: list[dict], claim: Claim) -> dict:
    """One claim alone (a family of one: no multiplicity correction); judge_all for a table."""
    return judge_all(rows, [claim])[0]


def fmt(mean: float, low: float, high: float, digits: int = 3) -> str:
    if not math.isfinite(mean):
        return "n/a"
    if not math.isfinite(low):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def fmt_p(p: float) -> str:
    return "n/a" if not math.isfinite(p) else f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def hypothesis(c: Claim) -> str:
    """The claim's one-sided alternative, as the tests table writes it."""
    if c.kind is ClaimKind.EQUIVALENT:
        return f"abs(diff) < {c.margin:g} (TOST)"
    bound = -c.margin if c.kind is ClaimKind.NONINFERIOR else 0.0
    return f"diff {'<' if c.kind is ClaimKind.LESS else '>'} {bound:g}"


def claims_table(claims: Sequence[Claim], judged: Sequence[dict]) -> str:
    """The verdicts (7 cells a row: notebook 02 reads the verdict from the 7th), then the
    tests behind them (8 cells a row)."""
    lines = [
        "| claim | paper | metric | arm - baseline | paired diff [95% CI] | seeds | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for c, j in zip(claims, judged, strict=True):
        vs = f"{c.arm} - {c.baseline}" if c.baseline else f"{c.arm} (vs 0)"
        diff = fmt(j["mean"], j["low"], j["high"])
        lines.append(
            f"| {c.id} | {c.text} | {c.metric} | {vs} | {diff} | {j['seeds']} | {j['verdict']} |"
        )
    lines += [
        "",
        f"Holm families, each over these {len(claims)} claims: the claims' own tests (p), "
        "the opposite's tests (p opposite), the bounding tests (against the paper's effect e "
        "where given, else no effect > kjax's margin m).",
        "",
        "| claim | H1 | p | Holm p | p opposite (Holm p) | MDE (80%) | bound | "
        "bound: p (Holm p) | seeds for MDE = m |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c, j in zip(claims, judged, strict=True):
        mde_ = "n/a" if not math.isfinite(j["mde"]) else f"{j['mde']:.3f}"
        bound = f"{fmt_p(j['p_bound'])} ({fmt_p(j['p_bound_holm'])})"
        if c.paper_effect is not None:
            what = f"paper's e = {c.paper_effect:+g}"
        elif c.equivalence_margin is not None:
            what = f"m = {c.equivalence_margin:g}"
        else:
            what = "n/a"
        lines.append(
            f"| {c.id} | {hypothesis(c)} | {fmt_p(j['p'])} | {fmt_p(j['p_holm'])} | "
            f"{fmt_p(j['p_opposite'])} ({fmt_p(j['p_opposite_holm'])}) | {mde_} | {what} | "
            f"{bound} | {j['seeds_for_mde'] or 'n/a'} |"
        )
    return "\n".join(lines)


_METRIC_KEY = re.compile(r"(?:(?P<scope>.+)/)?(?P<name>[A-Za-z_]\w*)@(?P<k>[1-9][0-9]*)")


@dataclasses.dataclass(frozen=True)
class MetricKey:
    """The key of a k-sample metric: "pass@8" is MetricKey("pass", 8), "epoch1/pass@256" is
    MetricKey("pass", 256, scope="epoch1"). Written with str(), read back with parse()."""

    name: str
    k: int
    scope: str = ""

    def __str__(self) -> str:
        key = f"{self.name}@{self.k}"
        return f"{self.scope}/{key}" if self.scope else key

    @classmethod
    def parse(cls, key: str) -> MetricKey:
        found = _METRIC_KEY.fullmatch(key)
        if found is None:
            raise ValueError(
                f"metric key {key!r} is not NAME@K or SCOPE/NAME@K with K >= 1 "
                "(e.g. 'pass@8', 'epoch1/pass@256')"
            )
        return cls(found["name"], int(found["k"]), found["scope"] or "")

    @classmethod
    def find(cls, key: str) -> MetricKey | None:
        """parse(key) for a k-sample metric; None for a scalar one (no '@': 'gradvar')."""
        return cls.parse(key) if "@" in key else None
