"""Arms x seeds for the paper tables: run, resume, summarise, and judge each claim.

A table module declares a `Table` (arms, claims written before running, the metric
columns) and calls `main(table, argv)`. Each (arm, seed) trains in its own workdir
WORKDIR/runs/ARM/seedS through `kjax.rl.loop.train_and_evaluate` (no second trainer)
and leaves a `result.json` there when done, so an interrupted table resumes and finished
runs are skipped. Every arm of a seed warm-starts from the same SFT checkpoint
(SFT_DIR/seedS, shared through SFTConfig.cache_dir) and is evaluated on the same
held-out problems with the same sample count, with kjax's unbiased estimators.

Statistics. Per arm: mean and 95% Student-t interval over seeds. Per claim: the paired
differences d_s = metric(arm, s) - metric(baseline, s) (same seed, same warm start) and
their 95% two-sided t-interval, i.e. each directional claim is a one-sided paired t-test at
2.5% (GREATER: H1 mean d > 0; LESS: mean d < 0; NONINFERIOR: mean d > -margin). An
EQUIVALENT claim is two one-sided tests (TOST) at 5%, p the larger of the two (the 90%
interval inside [-margin, margin]). The claims of one table are one family: every raw p is
Holm-adjusted over the table's claims, and a claim is "reproduced" when its adjusted p is
below 0.025 (0.05 for TOST), so the table's family-wise error is at most 5%. "opposite":
the test of the other direction passes the same way (NONINFERIOR: inferior beyond the
margin; EQUIVALENT: outside the margin, either side). Otherwise, when TOST shows d
equivalent to 0 within the claim's equivalence_margin m (Holm-adjusted p < 0.05), "not
reproduced (no effect larger than m)"; else "not reproduced (inconclusive)". MDE (80%):
(t_{0.975,n-1} + t_{0.8,n-1}) sd(d) / sqrt(n), the true difference a one-sided 2.5% test
detects with 80% power at the observed paired sd (before the Holm correction).

Diverged runs (non-finite loss, FloatingPointError) are rows with status "diverged": counted
in the table, left out of differences. Any other exception of an arm stops the table
(ArmFailed names arm and seed; the CLI exits 1): a broken arm is never a result. Every row
records the provenance() of the process that ran it, and NAME.md that of its writer.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import math
import os
import pathlib
import platform
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

REPRODUCED, OPPOSITE, INCONCLUSIVE = "reproduced", "opposite", "not reproduced (inconclusive)"
ALPHA = 0.025  # each directional claim: one side of the two-sided 95% interval
ALPHA_TOST = 0.05  # each of an equivalence's two one-sided tests: the 90% interval
TEST = (
    "Test: the paired 95% two-sided t-interval over seeds, i.e. each directional claim is a "
    "one-sided paired t-test at 2.5% (an equivalence: two one-sided tests at 5%); the claims "
    "of this table are judged together (Holm), and 'reproduced' needs the Holm-adjusted p "
    "below 0.025 (0.05 for an equivalence). 'no effect larger than m': the paired difference "
    "is equivalent to 0 within +-m (two one-sided tests at 5%, Holm-adjusted). MDE (80%): the "
    "true difference a one-sided 2.5% test detects with 80% power at the observed paired sd."
)


def no_effect(margin: float) -> str:
    """The verdict of a claim not reproduced whose difference is within +-margin of 0."""
    return f"not reproduced (no effect larger than {margin:g})"


class ClaimKind(enum.Enum):
    GREATER = "greater"  # the paper: arm > baseline
    LESS = "less"  # the paper: arm < baseline
    EQUIVALENT = "equivalent"  # the paper: arm matches baseline (|diff| <= margin)
    NONINFERIOR = "noninferior"  # the paper: arm at least as good (diff >= -margin)


@dataclasses.dataclass(frozen=True)
class Arm:
    """make(base config of one seed) -> that arm's TrainConfig."""

    name: str
    make: Callable


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
    equivalence_margin: float = 0.03  # a null result rules out effects larger than this


@dataclasses.dataclass(frozen=True)
class Table:
    """name: output file stem; base(seed, smoke) -> TrainConfig before the arm's changes;
    columns: (label, metric key) of the arm table; execute(table, arm, seed, run_dir,
    ctx) -> metrics dict (default: one RL run); per_seed(table, seed, ctx) -> {arm: {metric:
    value}} extra measurements merged into that seed's rows (e.g. gradient variance)."""

    name: str
    title: str
    arms: tuple[Arm, ...]
    claims: tuple[Claim, ...]
    columns: tuple[tuple[str, str], ...]
    base: Callable
    budget: str
    execute: Callable | None = None
    per_seed: Callable | None = None
    plot: Callable | None = None
    smoke_arms: tuple[str, ...] = ()  # --smoke trains only these (all if empty)
    derive: Callable | None = None  # metrics -> extra metrics computed from them (e.g. logs)


@dataclasses.dataclass(frozen=True)
class Context:
    workdir: pathlib.Path
    sft_dir: pathlib.Path
    smoke: bool
    log: Callable = print


class ArmFailed(RuntimeError):
    """An arm raised while being built or run (not a divergence): a bug, never a result."""


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


# ----------------------------------------------------------------------------- provenance


def git_commit(repo: pathlib.Path = pathlib.Path(__file__).parent) -> str:
    """HEAD of the git checkout holding `repo`, "-dirty" if tracked files differ from it;
    "unknown" without git or outside a checkout."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=repo, capture_output=True, text=True, timeout=30, check=True
        )
        return done.stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        changes = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if changes else "")


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else platform.processor())."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def provenance() -> dict:
    """Where a result was computed: package versions, CPU, cores, JAX devices, git commit."""
    import importlib.metadata

    import jax

    def version(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    versions = {p: version(p) for p in ("jax", "jaxlib", "flax", "optax", "numpy")}
    return {
        "versions": {**versions, "python": platform.python_version()},
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "backend": jax.default_backend(),
        "devices": [d.device_kind for d in jax.devices()],
        "commit": git_commit(),
    }


def provenance_line(p: dict) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in p["versions"].items())
    devices = sorted(set(p["devices"]))
    return (
        f"Written at commit {p['commit']} with {versions}; {p['cpu']} ({p['cores']} cores); "
        f"JAX backend {p['backend']}, {len(p['devices'])} device(s) ({', '.join(devices)}). "
        "Each JSONL row records the provenance of its run."
    )


# ---------------------------------------------------------------------------------- runs


def slug(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9]+", "_", name).strip("_").lower()


def with_seed(cfg, seed: int, sft_dir: pathlib.Path):
    """cfg for `seed`, its SFT warm start cached in sft_dir/seedS (shared by all arms)."""
    sft = dataclasses.replace(cfg.sft, cache_dir=str(sft_dir / f"seed{seed}"))
    return dataclasses.replace(cfg, seed=seed, sft=sft)


def budget(cfg, steps: int, batch: int, samples: int):
    """cfg with `steps` RL steps of `batch` prompts x `samples` (schedule, evals adjusted)."""
    warmup = min(cfg.optimizer.warmup_steps, steps - 1)
    opt = dataclasses.replace(cfg.optimizer, total_steps=steps, warmup_steps=warmup)
    ev = dataclasses.replace(cfg.eval, every=max(1, steps // 2))
    ck = dataclasses.replace(cfg.checkpoint, every=max(1, steps // 2))
    return dataclasses.replace(cfg, steps=steps, batch_prompts=batch, samples=samples,
                               optimizer=opt, eval=ev, checkpoint=ck)  # fmt: skip


SMOKE_BUDGET = ("SMOKE, not a result: 2 RL steps of 8 x 8 from a 4-step SFT, tiny eval; "
                "arms marked 'validated' were configured and validated, not trained")  # fmt: skip
SMOKE_SKIPPED = "validated"
RUNNING = "running in another worker"


def smoke_base(cfg):
    """The --smoke budget: a 1-layer d=32 model, 2 RL steps of 8 x 8, 4 SFT steps, a tiny
    eval (16 problems x 16 samples), on 1-digit problems. Same warm start for every module,
    so tests can share one SFT_DIR. Only Table.smoke_arms train (CI time); the other arms'
    configs are built and validated."""
    m = dataclasses.replace(cfg.model, hidden_size=32, num_layers=1, num_heads=2,
                            num_kv_heads=1, intermediate_size=64)  # fmt: skip
    task = dataclasses.replace(cfg.task, digits=1, train_size=150, test_size=16)
    sft = dataclasses.replace(cfg.sft, steps=4, batch_size=8)
    ev = dataclasses.replace(cfg.eval, n_eval=16, problems=16)
    cfg = dataclasses.replace(cfg, model=m, task=task, sft=sft, eval=ev, max_new_tokens=4)
    return budget(cfg, 2, 8, 8)


def rl_execute(table: Table, arm: Arm, seed: int, run_dir: pathlib.Path, ctx: Context) -> dict:
    """One RL run of arm at seed: the first and the last evaluation, and the run's shape."""
    from kjax.evaluation import read_jsonl
    from kjax.rl.loop import train_and_evaluate

    cfg = arm.make(with_seed(table.base(seed, ctx.smoke), seed, ctx.sft_dir))
    cfg = dataclasses.replace(cfg, name=slug(arm.name))
    last = train_and_evaluate(cfg, run_dir / "run", log=lambda *a, **k: None, progress=False)
    first = str(MetricKey("pass", 1, scope="eval"))
    rows = [r for r in read_jsonl(run_dir / "run" / "metrics.jsonl") if first in r]
    at_k = {key: MetricKey.find(key) for key in rows[0]}
    start = {
        str(dataclasses.replace(m, scope="start")): rows[0][key]
        for key, m in at_k.items()
        if m is not None
    }
    return {**{k.removeprefix("eval/"): v for k, v in last.items()}, **start,
            "steps": cfg.steps, "B": cfg.batch_prompts, "N": cfg.samples}  # fmt: skip


def open_run(cfg, workdir: pathlib.Path, log=lambda *a, **k: None):
    """(kjax.rl.components.Components, params after the SFT warm start) of cfg in workdir,
    for measurements outside the RL loop; close the Components when done."""
    from kjax.rl.loop import build_components

    components, state = build_components(cfg, workdir, log=log)
    return components, state.params


def run_one(table: Table, arm: Arm, seed: int, ctx: Context) -> dict:
    """The result row of (arm, seed), from its result.json when already done. ArmFailed when
    the arm raises anything but FloatingPointError (a divergence: a "diverged" row)."""
    run_dir = ctx.workdir / "runs" / slug(arm.name) / f"seed{seed}"
    done = run_dir / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    try:
        row = _run(table, arm, seed, ctx, run_dir)
    except Exception as e:
        raise ArmFailed(
            f"table {table.name}: arm {arm.name!r} at seed {seed} failed with "
            f"{type(e).__name__}: {e}"
        ) from e
    ctx.log(f"[{table.name}] {arm.name} seed {seed}: {row['status']} ({row['wall_s']} s)")
    return row


def _run(table: Table, arm: Arm, seed: int, ctx: Context, run_dir: pathlib.Path) -> dict:
    row = {"table": table.name, "arm": arm.name, "seed": seed, "provenance": provenance()}
    if ctx.smoke and table.smoke_arms and arm.name not in table.smoke_arms:
        import jax  # keep CI short: the other arms' configs are built and validated only

        arm.make(with_seed(table.base(seed, True), seed, ctx.sft_dir)).validate(jax.device_count())
        return {**row, "status": SMOKE_SKIPPED, "metrics": {}, "wall_s": 0.0}
    import fcntl

    done = run_dir / "result.json"
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "lock", "w") as lock:  # several workers may share one table
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return {**row, "status": RUNNING, "metrics": {}, "wall_s": 0.0}
        if done.exists():  # another worker finished it meanwhile
            return json.loads(done.read_text())
        start = time.time()
        try:
            metrics = (table.execute or rl_execute)(table, arm, seed, run_dir, ctx)
            finite = all(math.isfinite(v) for v in metrics.values() if isinstance(v, float))
            row.update(status="ok" if finite else "diverged", metrics=metrics)
        except FloatingPointError as e:
            row.update(status="diverged", metrics={}, error=str(e).splitlines()[0])
        row["wall_s"] = round(time.time() - start, 1)
        done.write_text(json.dumps(row, indent=1))
    return row


def warm_start(table: Table, seed: int, ctx: Context) -> None:
    """Builds seed's shared SFT warm start once, under a file lock, so that tables run in
    parallel with one --sft_dir never train the same warm start twice at the same time."""
    import fcntl

    cfg = with_seed(table.base(seed, ctx.smoke), seed, ctx.sft_dir)
    if not cfg.sft.steps:
        return
    ctx.sft_dir.mkdir(parents=True, exist_ok=True)
    with open(ctx.sft_dir / f"seed{seed}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        components, _ = open_run(cfg, ctx.workdir / "runs" / "_warm_start" / f"seed{seed}", ctx.log)
        components.close()
        fcntl.flock(lock, fcntl.LOCK_UN)


def run_table(table: Table, seeds: Sequence[int], ctx: Context) -> list[dict]:
    rows = []
    for seed in seeds:  # seed-major: each warm start is built once, then reused
        warm_start(table, seed, ctx)
        seed_rows = [run_one(table, arm, seed, ctx) for arm in table.arms]
        if table.per_seed is not None:
            extra_path = ctx.workdir / "runs" / "_per_seed" / f"seed{seed}.json"
            if not extra_path.exists():
                extra_path.parent.mkdir(parents=True, exist_ok=True)
                extra = table.per_seed(table, seed, ctx)
                extra_path.write_text(json.dumps(extra, indent=1))
            merge(table, seed_rows, json.loads(extra_path.read_text()))
        else:
            merge(table, seed_rows, {})
        rows += seed_rows
    return rows


def merge(table: Table, rows: list[dict], extra: dict) -> None:
    """Adds the per-seed measurements and the table's derived metrics to each row."""
    for row in rows:
        row["metrics"] = {**row["metrics"], **extra.get(row["arm"], {})}
        if table.derive is not None and row["status"] == "ok":
            row["metrics"].update(table.derive(row["metrics"]))


# ----------------------------------------------------------------------------- statistics


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


def verdict(
    kind: ClaimKind,
    p: float,
    p_opposite: float,
    p_equivalent: float = math.nan,
    equivalence_margin: float = 0.03,
) -> str:
    """The verdict from (Holm-adjusted) p's of claim_p and of p_tost(d, equivalence_margin)."""
    if p < alpha(kind):
        return REPRODUCED
    if p_opposite < alpha(kind):
        return OPPOSITE
    if p_equivalent < ALPHA_TOST:
        return no_effect(equivalence_margin)
    return INCONCLUSIVE


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
        j["p_equivalent"] = p_tost(d, c.equivalence_margin)
        j["mde"] = mde(sd, len(d))
        j["seeds_for_mde"] = seeds_for_mde(sd, c.equivalence_margin) if len(d) > 1 else None
        out.append(j)
    for key in ("p", "p_opposite", "p_equivalent"):
        for j, adjusted in zip(out, holm([j[key] for j in out]), strict=True):
            j[f"{key}_holm"] = float(adjusted)
    for c, j in zip(claims, out, strict=True):
        p_holm = (j["p_holm"], j["p_opposite_holm"], j["p_equivalent_holm"])
        j["verdict"] = verdict(c.kind, *p_holm, c.equivalence_margin)
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


def arm_table(rows: list[dict], arms: Sequence[str], columns) -> str:
    head = "| arm | " + " | ".join(label for label, _ in columns) + " | runs |"
    lines = [head, "|" + "---|" * (len(columns) + 2)]
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        cells = [fmt(*t_interval(list(values(rows, arm, key).values()))) for _, key in columns]
        kinds = ("ok", "diverged", SMOKE_SKIPPED, RUNNING)
        status = {s: sum(r["status"] == s for r in mine) for s in kinds}
        runs = ", ".join(f"{n} {s}" for s, n in status.items() if n) or "0"
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {runs} |")
    start = [f"start/{key}" for _, key in columns]
    first = arms[0]
    if all(values(rows, first, key) for key in start):  # the shared warm start, before RL
        cells = [fmt(*t_interval(list(values(rows, first, key).values()))) for key in start]
        n = len(values(rows, first, start[0]))
        lines.append("| SFT warm start (before RL) | " + " | ".join(cells) + f" | {n} ok |")
    return "\n".join(lines)


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
        "| claim | H1 | p | Holm p | MDE (80%) | m | no effect > m: p (Holm p) | "
        "seeds for MDE = m |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c, j in zip(claims, judged, strict=True):
        mde_ = "n/a" if not math.isfinite(j["mde"]) else f"{j['mde']:.3f}"
        equivalent = f"{fmt_p(j['p_equivalent'])} ({fmt_p(j['p_equivalent_holm'])})"
        lines.append(
            f"| {c.id} | {hypothesis(c)} | {fmt_p(j['p'])} | {fmt_p(j['p_holm'])} | "
            f"{mde_} | {c.equivalence_margin:g} | {equivalent} | "
            f"{j['seeds_for_mde'] or 'n/a'} |"
        )
    return "\n".join(lines)


def report(
    table: Table, rows: list[dict], seeds: Sequence[int], smoke: bool, written: dict | None = None
) -> str:
    """The Markdown of the table: budget, the test, arm table, claims with verdicts and
    their tests, run time, and `written` (a provenance() of the writer) when given."""
    hours = sum(r.get("wall_s", 0.0) for r in rows) / 3600
    diverged = [f"{r['arm']} (seed {r['seed']})" for r in rows if r["status"] == "diverged"]
    judged = judge_all(rows, table.claims)
    parts = [
        f"## {table.title}",
        "",
        f"Budget: {SMOKE_BUDGET if smoke else table.budget}. Seeds: "
        f"{', '.join(map(str, seeds))}. Cells: mean over seeds [95% t-interval].",
        "",
        arm_table(rows, [a.name for a in table.arms], table.columns),
        "",
        claims_table(table.claims, judged),
        "",
        TEST,
        "",
        f"Diverged: {', '.join(diverged) or 'none'}. Compute: {hours:.2f} h of run time "
        "(sum over runs).",
    ]
    if written is not None:
        parts += ["", provenance_line(written)]
    return "\n".join(parts) + "\n"


def bar_plot(table: Table, rows: list[dict], path: pathlib.Path) -> None:
    """Grouped bars with 95% intervals: the @k metrics in one panel (a group per column,
    a bar per arm), every other column (e.g. gradient variance) in its own log panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a.name for a in table.arms]
    rates = [c for c in table.columns if MetricKey.find(c[1]) is not None]
    others = [c for c in table.columns if MetricKey.find(c[1]) is None]
    panels = [rates] + [[c] for c in others] if rates else [[c] for c in others]
    widths = [max(4, 1.1 * len(p) * len(arms) / 3) for p in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(widths), 4.2), squeeze=False,
                             gridspec_kw={"width_ratios": widths})  # fmt: skip
    width = 0.8 / len(arms)
    for ax, cols in zip(axes[0], panels, strict=True):
        for i, arm in enumerate(arms):
            cis = [t_interval(list(values(rows, arm, key).values())) for _, key in cols]
            mean = np.array([m for m, _, _ in cis])
            err = np.array([[m - lo, hi - m] for m, lo, hi in cis]).T
            ax.bar(np.arange(len(cols)) + i * width, mean, width, label=arm,
                   yerr=np.nan_to_num(err), capsize=2)  # fmt: skip
        ax.set_xticks(np.arange(len(cols)) + 0.4 - width / 2, [label for label, _ in cols])
        if cols is not rates:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("mean over seeds, 95% CI")
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.suptitle(table.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(table: Table, rows: list[dict], seeds, smoke: bool, out: pathlib.Path) -> str:
    """NAME.jsonl (a row per run), NAME.claims.json (judge_all's p's and verdicts), NAME.md
    and NAME.png in out; the last three record this writer's provenance()."""
    out.mkdir(parents=True, exist_ok=True)
    written = provenance()
    (out / f"{table.name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    judged = [
        {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in j.items()}
        for j in judge_all(rows, table.claims)
    ]
    claims = {"test": TEST, "seeds": list(seeds), "provenance": written, "claims": judged}
    (out / f"{table.name}.claims.json").write_text(json.dumps(claims, indent=1) + "\n")
    text = report(table, rows, seeds, smoke, written)
    (out / f"{table.name}.md").write_text(text)
    (table.plot or bar_plot)(table, rows, out / f"{table.name}.png")
    return text


def parse(prog: str, argv=None, default_seeds: int = 5) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"experiments.{prog}")
    p.add_argument("--workdir", required=True, help="runs under WORKDIR/runs; outputs in WORKDIR")
    p.add_argument("--seeds", type=int, default=default_seeds,
                   help=f"seeds 0..SEEDS-1 (default {default_seeds})")  # fmt: skip
    p.add_argument("--smoke", action="store_true", help="2 steps, 1 seed, tiny eval (CI)")
    p.add_argument("--sft_dir", default="", help="shared SFT warm starts (default WORKDIR/sft)")
    p.add_argument("--report_only", action="store_true",
                   help="train nothing: tabulate the seeds whose arms all finished")  # fmt: skip
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error(f"--seeds must be >= 1; got {args.seeds}")
    return args


def setup_jax(workdir: pathlib.Path) -> None:
    """Quiet TFDS, and a persistent compile cache: arms that differ only in their
    advantages compile the same train step, so later runs load it instead of compiling."""
    import jax
    from absl import logging

    logging.set_verbosity(logging.ERROR)
    if not jax.config.jax_compilation_cache_dir:  # JAX_COMPILATION_CACHE_DIR may share one
        jax.config.update("jax_compilation_cache_dir", str(workdir / "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def finished_rows(table: Table, seeds: Sequence[int], ctx: Context) -> tuple[list, list]:
    """(rows, seeds) of the leading seeds whose every arm (and per-seed measurement) has
    finished; stops at the first incomplete seed, so no seed is ever picked."""
    rows, done = [], []
    for seed in seeds:
        paths = [ctx.workdir / "runs" / slug(a.name) / f"seed{seed}" / "result.json"
                 for a in table.arms]  # fmt: skip
        extra = ctx.workdir / "runs" / "_per_seed" / f"seed{seed}.json"
        if not all(p.exists() for p in paths) or (table.per_seed and not extra.exists()):
            break
        seed_rows = [json.loads(p.read_text()) for p in paths]
        merge(table, seed_rows, json.loads(extra.read_text()) if table.per_seed else {})
        rows, done = rows + seed_rows, done + [seed]
    return rows, done


def main(table: Table, argv=None, default_seeds: int = 5) -> int:
    args = parse(table.name, argv, default_seeds)
    workdir = pathlib.Path(args.workdir)
    setup_jax(workdir)
    seeds = [0] if args.smoke else list(range(args.seeds))
    ctx = Context(workdir, pathlib.Path(args.sft_dir or workdir / "sft"), args.smoke)
    start = time.time()
    if args.report_only:
        rows, seeds = finished_rows(table, seeds, ctx)
    else:
        try:
            rows = run_table(table, seeds, ctx)
        except ArmFailed as e:  # finished runs are kept; the table resumes after the fix
            traceback.print_exception(e.__cause__)
            print(f"error: {e}. No table was written; fix the arm and rerun.", file=sys.stderr)
            return 1
    text = write_outputs(table, rows, seeds, args.smoke, workdir)
    print(
        f"\n{text}\nwall time of this invocation: {(time.time() - start) / 60:.1f} min; "
        f"{workdir}/{table.name}.{{md,jsonl,claims.json,png}}"
    )
    return 0
