"""Held-out evaluation: pass@k, max@k and maj@k curves (unbiased estimators) and plots.

`k_values(n)` = 1, 2, 4, ..., n. Every metric is averaged over problems from n samples
each, with kjax.objectives' U-statistics (no bias from reusing the n samples across k).
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from kjax import objectives
from kjax.rewards.verdict import Verdicts


def k_values(n: int) -> list[int]:
    """Powers of two up to n (n itself included)."""
    ks = [1]
    while ks[-1] * 2 <= n:
        ks.append(ks[-1] * 2)
    return ks if ks[-1] == n else ks + [n]


def group_metrics(verdicts: Verdicts) -> dict[str, float]:
    """{"pass@k", "max@k", "maj@k"} for every k in k_values(N), means over B problems.

    pass@k counts a sample correct when its score is 1 (binary verifiers); max@k uses the
    scores as rewards (equal to pass@k for binary ones); maj@k votes over answer ids.
    """
    scores = jnp.asarray(verdicts.scores)
    correct = scores >= 1.0
    answers, target = jnp.asarray(verdicts.answer_ids), jnp.asarray(verdicts.target)
    out = {}
    for k in k_values(scores.shape[1]):
        out[f"pass@{k}"] = float(jnp.mean(objectives.pass_at_k(correct, k)))
        out[f"max@{k}"] = float(jnp.mean(objectives.max_at_k(scores, k)))
        out[f"maj@{k}"] = float(jnp.mean(objectives.majority_at_k(answers, target, k)))
    return out


def read_jsonl(path) -> list[dict]:
    """A metrics.jsonl's rows (none if absent; a torn last line left out: kjax.files)."""
    from kjax import files

    return files.read_jsonl(path)


def plot(records: list[dict], directory, title: str = "") -> list[pathlib.Path]:
    """PNGs of pass@k vs step (one line per k) and pass@k vs k (first and last eval).

    records: the eval rows of metrics.jsonl ({"step", "eval/pass@1", ...}).
    """
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    rows = [r for r in records if any(key.startswith("eval/pass@") for key in r)]
    if not rows:
        return []
    directory = pathlib.Path(directory)
    ks = sorted(int(key.split("@")[1]) for key in rows[-1] if key.startswith("eval/pass@"))
    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for k in ks:
        ax.plot(steps, [r[f"eval/pass@{k}"] for r in rows], marker="o", label=f"pass@{k}")
    ax.set(xlabel="RL step", ylabel="held-out pass@k", title=title, ylim=(0, 1))
    ax.legend(fontsize=7)
    fig.tight_layout()
    by_step = directory / "pass_at_k_vs_step.png"
    fig.savefig(by_step, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for r, label in ((rows[0], f"step {rows[0]['step']}"), (rows[-1], f"step {rows[-1]['step']}")):
        ax.plot(ks, [r[f"eval/pass@{k}"] for k in ks], marker="o", label=label)
    ax.set(xscale="log", xlabel="k", ylabel="held-out pass@k", title=title, ylim=(0, 1))
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.legend()
    fig.tight_layout()
    by_k = directory / "pass_at_k_vs_k.png"
    fig.savefig(by_k, dpi=120)
    plt.close(fig)
    return [by_step, by_k]


def to_host(x) -> np.ndarray:
    """A global jax.Array as a full numpy array on every host (an all-gather off one host)."""
    if jax.process_count() == 1:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
