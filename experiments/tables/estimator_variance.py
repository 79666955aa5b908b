"""PKPO's toy: variance of max@k gradient estimators as the group size N grows.

  python -m experiments.tables.estimator_variance --workdir=runs/estimator_variance

CPU, under a minute. Policy x ~ N(theta, 0.1^2), reward g(x) = x^2 on [0, 1] (0 outside).
For k = 4 and N in {4, 8, 16, 32}, each estimator's d/dtheta estimate
sum_i A_i d/dtheta log pi(x_i) is drawn `trials` times; the table gives its variance, its
mean and the exact gradient (quadrature). The MAXRL rows are the mixture
sum_{j<=T} (1/j) max@j (MaxRL's weights, T = k) with a per-j estimator; they target
sum_{j<=T} J_j' / j instead. Writes variance.md, variance.png, signal_density.png
(Tang et al.'s k p (1-p)^(k-1)) and results.json to --workdir.

--extended adds rows that docs/estimator_variance.md's table does not have
(docs/estimators.md sections 2.11, 2.12): SHRINK_B<b>[E], max@k with E's leave-one-out
baseline shrunk toward the other prompts of a batch of b groups (the toy has one prompt,
so the b groups share it: no spread between prompts, so the shrinkage factor is large);
MEAN[RLOO] and
MEAN_B<b>[SHRINKAGE], the k = 1 baselines (target J_1'); MAXRL_PRACTICAL, MaxRL's
per-group (r - mean) / mean / N, which on these continuous rewards targets no max@k
mixture (it is a ratio estimate near grad log J_1, printed for comparison). It also writes
variance_binary.md: on binary rewards, where MAXRL_PRACTICAL is unbiased for the mixture at
T = N - 1, the exact variance of both by enumerating every outcome.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging
from tqdm import tqdm

from kjax import objectives as obj
from kjax.files import write_atomic, write_figure

E = obj.MaxAtKEstimator
M = obj.MeanBaseline


@dataclasses.dataclass(frozen=True)
class Config:
    """The toy's knobs; defaults reproduce docs/estimator_variance.md's table."""

    theta: float = 0.5
    sigma: float = 0.1
    k: int = 4
    group_sizes: tuple[int, ...] = (4, 8, 16, 32)
    trials: int = 50_000
    seed: int = 0
    estimators: tuple[E, ...] = (E.S, E.LOO, E.L2O, E.LOO_MINUS_ONE, E.CENTERED)
    # Per-j estimators of the MaxRL mixture sum_{j<=k} (1/j) max@j (one row each).
    maxrl_estimators: tuple[E, ...] = (E.LOO_MINUS_ONE, E.L2O)
    # Opt-in rows (--extended; none by default, so the default output is the table of
    # docs/estimator_variance.md).
    shrinkage_estimators: tuple[E, ...] = ()  # max@k, baseline shrunk over a batch
    mean_baselines: tuple[M, ...] = ()  # k = 1 rows, in the sum convention
    maxrl_practical: bool = False  # (r - mean) / mean / N
    shrinkage_batch: int = 8  # groups per batch for the SHRINK and SHRINKAGE rows

    def batched(self) -> bool:
        """Whether some row shrinks over a batch (so trials split into batches)."""
        return bool(self.shrinkage_estimators) or M.SHRINKAGE in self.mean_baselines

    def validate(self) -> None:
        if not self.sigma > 0:
            raise ValueError(f"--sigma must be > 0; got {self.sigma}.")
        if self.trials < 2:
            raise ValueError(f"--trials must be >= 2 to estimate a variance; got {self.trials}.")
        if self.k < 1:
            raise ValueError(f"--k must be >= 1; got {self.k}.")
        if not self.group_sizes or min(self.group_sizes) < self.k:
            raise ValueError(
                f"--group_sizes must all be >= k={self.k} (no unbiased estimate from fewer "
                f"samples); got {list(self.group_sizes)}."
            )
        if self.batched() and (self.shrinkage_batch < 3 or self.trials % self.shrinkage_batch):
            raise ValueError(
                f"--shrinkage_batch must be >= 3 (fewer leaves no spread to shrink over) and "
                f"divide --trials={self.trials}; got {self.shrinkage_batch}."
            )


def reward(x: jax.Array) -> jax.Array:
    """g(x) = x^2 on [0, 1], 0 elsewhere."""
    return jnp.where((x >= 0.0) & (x <= 1.0), x * x, 0.0)


def expected_max_reward(theta, sigma: float, k: int, grid: int = 20_001):
    """J_k(theta) = E[max of k rewards] = int_0^1 P(max > t) dt, by the trapezoid rule."""
    t = jnp.linspace(0.0, 1.0, grid)
    cdf = jax.scipy.stats.norm.cdf
    p_above = cdf((1.0 - theta) / sigma) - cdf((jnp.sqrt(t) - theta) / sigma)  # P(g(x) > t)
    return jnp.trapezoid(1.0 - (1.0 - p_above) ** k, t)


def true_gradient(theta: float, sigma: float, k: int) -> float:
    with jax.enable_x64(True):
        grad = jax.grad(expected_max_reward)(jnp.float64(theta), sigma, k)
    return float(grad)


@functools.partial(jax.jit, static_argnames=("advantage_fn", "n", "trials"))
def gradient_estimates(key, theta, sigma, *, advantage_fn, n: int, trials: int) -> jax.Array:
    """[trials] draws of sum_i A_i d/dtheta log N(x_i; theta, sigma^2), one group each.

    advantage_fn: rewards [B, N] -> advantages [B, N] (any kjax estimator, or a new one).
    """
    x = theta + sigma * jax.random.normal(key, (trials, n))
    score = (x - theta) / sigma**2
    return jnp.sum(advantage_fn(reward(x)) * score, axis=-1)


def row_specs(config: Config) -> list[tuple[str, object, int]]:
    """(row name, advantage fn rewards [B, N] -> [B, N], smallest N it accepts) per row."""
    k = config.k
    rows = [
        (e.name, functools.partial(obj.max_at_k_advantages, k=k, estimator=e), e.min_samples(k))
        for e in config.estimators
    ]
    weights = obj.maxrl_weights(k)
    for e in config.maxrl_estimators:
        fn = functools.partial(obj.max_at_k_mixture_advantages, weights=weights, estimator=e)
        rows.append((maxrl_name(k, e), fn, e.min_samples(k)))
    b = config.shrinkage_batch
    for e in config.shrinkage_estimators:
        fn = in_batches(functools.partial(obj.shrink_max_at_k_advantages, k=k, estimator=e), b)
        rows.append((f"SHRINK_B{b}[{e.name}]", fn, max(e.min_samples(k), 2)))
    for base in config.mean_baselines:
        fn = functools.partial(_sum_convention, obj.mean_advantages, baseline=base)
        if base is M.SHRINKAGE:
            rows.append((f"MEAN_B{b}[{base.name}]", in_batches(fn, b), 2))
        else:
            rows.append((f"MEAN[{base.name}]", fn, 2))
    if config.maxrl_practical:
        fn = functools.partial(_sum_convention, obj.maxrl_practical_advantages)
        rows.append(("MAXRL_PRACTICAL", fn, 1))
    return rows


def maxrl_name(t: int, e: E) -> str:
    return f"MAXRL_T{t}[{e.name}]"


def _sum_convention(fn, rewards: jax.Array, **kwargs) -> jax.Array:
    """fn's mean-convention advantages / N: the gradient is their plain sum."""
    return fn(rewards, **kwargs) / rewards.shape[1]


def in_batches(fn, b: int):
    """Applies fn to consecutive batches of b groups ([trials, N] -> [trials / b, b, N])."""

    def apply(rewards: jax.Array) -> jax.Array:
        trials, n = rewards.shape
        return jax.vmap(fn)(rewards.reshape(trials // b, b, n)).reshape(trials, n)

    return apply


def run(config: Config, workdir: pathlib.Path) -> dict:
    """Runs the toy, writes the table, plots and JSON to `workdir`; returns the results."""
    config.validate()
    workdir.mkdir(parents=True, exist_ok=True)
    grads = {j: true_gradient(config.theta, config.sigma, j) for j in range(1, config.k + 1)}
    exact = grads[config.k]
    exact_km1 = grads.get(config.k - 1, 0.0)
    exact_maxrl = sum(g / j for j, g in grads.items())
    exact_1 = grads[1]
    with jax.enable_x64(True):
        j1 = float(expected_max_reward(jnp.float64(config.theta), config.sigma, 1))
    grad_log_j1 = exact_1 / j1
    rows = {}
    specs = row_specs(config)
    keys = jax.random.split(jax.random.key(config.seed), len(config.group_sizes))
    jobs = [
        (spec, n, key) for n, key in zip(config.group_sizes, keys, strict=True) for spec in specs
    ]
    for (name, fn, min_n), n, key in tqdm(jobs, desc="estimators x N", file=sys.stderr):
        if n < min_n:
            continue  # LOO and L2O need N > k
        est = np.asarray(
            gradient_estimates(
                key, config.theta, config.sigma, advantage_fn=fn, n=n, trials=config.trials
            ),
            dtype=np.float64,
        )
        rows[(name, n)] = {
            "mean": est.mean(),
            "var": est.var(ddof=1),
            "stderr": est.std(ddof=1) / math.sqrt(len(est)),
        }
    results = {
        "config": {
            **dataclasses.asdict(config),
            "estimators": [e.name for e in config.estimators],
            "maxrl_estimators": [e.name for e in config.maxrl_estimators],
            "shrinkage_estimators": [e.name for e in config.shrinkage_estimators],
            "mean_baselines": [b.name for b in config.mean_baselines],
        },
        "true_gradient": exact,
        "true_gradient_k_minus_1": exact_km1,
        "true_gradient_maxrl": exact_maxrl,
        "true_gradient_k1": exact_1,
        "grad_log_j1": grad_log_j1,
        "rows": [{"estimator": e, "N": n, **v} for (e, n), v in rows.items()],
    }
    write_atomic(workdir / "results.json", json.dumps(results, indent=2))
    table = markdown_table(config, rows, exact, exact_km1, exact_maxrl, (exact_1, grad_log_j1))
    write_atomic(workdir / "variance.md", table)
    plot_variance(config, rows, workdir / "variance.png")
    plot_signal_density(workdir / "signal_density.png")
    print(table)
    print(f"wrote {workdir}/variance.md, variance.png, signal_density.png, results.json")
    return results


def binary_maxrl_variance(ps=(0.05, 0.2, 0.5), ns=(4, 8, 12)) -> list[dict]:
    """Exact mean and variance, on binary rewards, of MaxRL's practical form against the
    mixture it equals in expectation (docs/estimators.md section 2.12).

    One prompt with success probability p = sigmoid(theta); every one of the 2^N outcomes is
    enumerated (float64), and g = sum_i A_i d/dtheta log pi(y_i) = sum_i A_i (f_i - p) in
    kjax's sum convention. Rows: MAXRL_PRACTICAL ((r - mean) / mean / N) and the mixture
    with w_j = 1/j for j <= T = N - 1 with LOO_MINUS_ONE and with L2O; all three have mean
    grad J_{N-1} = (1 - (1 - p)^(N-1)) (1 - p), returned as "target".
    """
    import itertools

    specs = {
        "MAXRL_PRACTICAL": lambda r, n: obj.maxrl_practical_advantages(r) / n,
        "MAXRL_T(N-1)[LOO_MINUS_ONE]": lambda r, n: obj.max_at_k_mixture_advantages(
            r, obj.maxrl_weights(n - 1), estimator=E.LOO_MINUS_ONE
        ),
        "MAXRL_T(N-1)[L2O]": lambda r, n: obj.max_at_k_mixture_advantages(
            r, obj.maxrl_weights(n - 1), estimator=E.L2O
        ),
    }
    out = []
    with jax.enable_x64(True):
        for n in ns:
            f = np.array(list(itertools.product([0.0, 1.0], repeat=n)))  # [2^N, N]
            advs = {name: np.asarray(fn(jnp.asarray(f), n)) for name, fn in specs.items()}
            for p in ps:
                prob = np.prod(np.where(f == 1, p, 1 - p), axis=1)
                target = (1 - (1 - p) ** (n - 1)) * (1 - p)
                for name, adv in advs.items():
                    g = np.sum(adv * (f - p), axis=1)
                    mean = float(prob @ g)
                    var = float(prob @ (g - mean) ** 2)
                    out.append(dict(estimator=name, N=n, p=p, mean=mean, var=var, target=target))
    return out


def binary_table(rows: list[dict]) -> str:
    """The Markdown of binary_maxrl_variance: exact variance (mean) per (p, N)."""
    cols = sorted({(r["p"], r["N"]) for r in rows})
    names = list(dict.fromkeys(r["estimator"] for r in rows))
    cell = {(r["estimator"], r["p"], r["N"]): r for r in rows}
    lines = [
        "Exact variance of the d/dtheta estimate on binary rewards, one prompt with success "
        "probability p = sigmoid(theta), all 2^N outcomes (mean in brackets; every row's mean "
        "is grad J_(N-1) = (1 - (1-p)^(N-1)) (1-p), the last row).",
        "",
        "| estimator | " + " | ".join(f"p={p:g}, N={n}" for p, n in cols) + " |",
        "|" + "---|" * (len(cols) + 1),
    ]
    for name in names:
        cells = [f"{cell[name, p, n]['var']:.4g} ({cell[name, p, n]['mean']:.4f})" for p, n in cols]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    target = [f"{cell[names[0], p, n]['target']:.4f}" for p, n in cols]
    lines += ["| grad J_(N-1) | " + " | ".join(target) + " |", ""]
    return "\n".join(lines)


def markdown_table(
    config: Config,
    rows: dict,
    exact: float,
    exact_km1: float,
    exact_maxrl: float,
    k1: tuple[float, float] = (math.nan, math.nan),
) -> str:
    """The table and its notes; k1 = (J_1', grad log J_1), quoted by the --extended rows."""
    ns = config.group_sizes
    head = "| estimator | " + " | ".join(f"N={n}" for n in ns) + " |"
    lines = [
        f"Variance of the d/dtheta max@{config.k} estimate at theta={config.theta}, "
        f"sigma={config.sigma}, {config.trials} trials per cell "
        f"(exact gradient {exact:.5f}; mean +- stderr in brackets).",
        "",
        head,
        "|" + "---|" * (len(ns) + 1),
    ]
    for name, _, _ in row_specs(config):
        cells = []
        for n in ns:
            r = rows.get((name, n))
            cells.append(
                "n/a" if r is None else f"{r['var']:.3g} ({r['mean']:.4f} +- {r['stderr']:.4f})"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    k = config.k
    predicted = ", ".join(f"N={n}: {(1 - k / n) * exact + (k / n) * exact_km1:.4f}" for n in ns)
    lines += [
        "",
        f"CENTERED is biased by design: its mean is (1-k/N) J_k' + (k/N) J_(k-1)' ({predicted}).",
    ]
    if config.maxrl_estimators:
        lines.append(
            f"MAXRL_T{k} rows estimate sum_(j<={k}) J_j'/j = {exact_maxrl:.5f} (MaxRL's mixture "
            "weights 1/j), not J_k'."
        )
    b = config.shrinkage_batch
    if config.shrinkage_estimators:
        lines.append(
            f"SHRINK_B{b} rows shrink the leave-one-out baseline over batches of {b} groups of "
            "this one prompt (no spread between prompts, so lam is large: docs/estimators.md "
            "section 2.11 says why that can raise max@k's variance); they target J_k'."
        )
    if config.mean_baselines:
        lines.append(
            f"MEAN rows are k = 1 baselines (divided by N); they target J_1' = {k1[0]:.5f}."
        )
    if config.maxrl_practical:
        lines.append(
            "MAXRL_PRACTICAL is (r - mean) / mean / N: unbiased for sum_(j<N) J_j'/j on binary "
            f"rewards only; here a ratio estimate near grad log J_1 = {k1[1]:.5f}, biased at "
            "finite N."
        )
    lines.append("")
    return "\n".join(lines)


def plot_variance(config: Config, rows: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, _, _ in row_specs(config):
        ns = [n for n in config.group_sizes if (name, n) in rows]
        ax.plot(ns, [rows[(name, n)]["var"] for n in ns], marker="o", label=name)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="N (samples per prompt)",
        ylabel="variance of gradient estimate",
        title=f"max@{config.k} gradient estimators (PKPO toy)",
    )
    ax.set_xticks(config.group_sizes, [str(n) for n in config.group_sizes])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    write_figure(fig, path, dpi=120)
    plt.close(fig)


def plot_signal_density(path: pathlib.Path, ks=(1, 2, 4, 8, 16)) -> None:
    """Tang et al.: pass@k puts gradient weight k p (1-p)^(k-1) on a prompt of success p."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = np.linspace(0.0, 1.0, 501)
    fig, ax = plt.subplots(figsize=(6, 4))
    for k in ks:
        ax.plot(p, k * p * (1 - p) ** (k - 1), label=f"k={k}")
    ax.set(
        xlabel="p (single-sample success probability)",
        ylabel="k p (1-p)^(k-1)",
        title="Signal density of pass@k (peaks at p = 1/k)",
    )
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    write_figure(fig, path, dpi=120)
    plt.close(fig)


# The --extended rows.
EXTENDED = dict(
    shrinkage_estimators=(E.L2O, E.LOO_MINUS_ONE),
    mean_baselines=(M.RLOO, M.SHRINKAGE),
    maxrl_practical=True,
)

flags.DEFINE_string("workdir", "runs/estimator_variance", "Where to write the outputs.")
flags.DEFINE_float("theta", Config.theta, "Policy mean.")
flags.DEFINE_float("sigma", Config.sigma, "Policy standard deviation.")
flags.DEFINE_integer("k", Config.k, "The k of max@k.")
flags.DEFINE_list("group_sizes", [str(n) for n in Config.group_sizes], "Values of N.")
flags.DEFINE_integer("trials", Config.trials, "Gradient estimates drawn per (estimator, N).")
flags.DEFINE_integer("seed", Config.seed, "PRNG seed.")
flags.DEFINE_bool(
    "extended",
    False,
    "Also the rows docs/estimator_variance.md's table lacks: SHRINK_B<b>[L2O], "
    "SHRINK_B<b>[LOO_MINUS_ONE], MEAN[RLOO], MEAN_B<b>[SHRINKAGE], MAXRL_PRACTICAL; and "
    "variance_binary.md, MaxRL's practical form against its mixture, exactly, on binary "
    "rewards.",
)
flags.DEFINE_integer(
    "shrinkage_batch", Config.shrinkage_batch, "Groups per batch for the shrinkage rows."
)


def main(argv) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)  # keep jax's backend probing out of the output
    f = flags.FLAGS
    try:
        config = Config(
            theta=f.theta,
            sigma=f.sigma,
            k=f.k,
            trials=f.trials,
            seed=f.seed,
            group_sizes=tuple(int(n) for n in f.group_sizes),
            shrinkage_batch=f.shrinkage_batch,
            **(EXTENDED if f.extended else {}),
        )
        config.validate()
    except ValueError as err:
        raise app.UsageError(str(err)) from err
    run(config, pathlib.Path(f.workdir))
    if f.extended:  # MaxRL's practical form against its mixture, exactly, on binary rewards
        table = binary_table(binary_maxrl_variance())
        write_atomic(pathlib.Path(f.workdir) / "variance_binary.md", table)
        print(table)


if __name__ == "__main__":
    app.run(main)
