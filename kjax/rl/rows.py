"""The rows the RL loop logs and shows: a step's metrics row, its real-token counts, the
held-out evaluation's metrics, the progress bar's postfix (pure functions of host values;
kjax.rl.loop and kjax.rl.seeds build their rows with them)."""

from __future__ import annotations

import jax
import numpy as np

from kjax import evaluation, objectives
from kjax.rewards.verdict import Verdicts
from kjax.rl.config import TrainConfig
from kjax.rl.objective import objective_ks, objective_value


def eval_metrics(cfg: TrainConfig, v: Verdicts) -> dict[str, float]:
    """evaluate's metrics of the verdicts [B, eval.n_eval] of the held-out problems."""
    out = evaluation.group_metrics(v)
    final_k = cfg.k_at(cfg.steps - 1)  # the objective the run ends with
    if max(objective_ks(cfg.objective, final_k)) <= cfg.eval.n_eval:
        out["objective"] = objective_value(cfg.objective, final_k, v.scores, v.answer_ids, v.target)
    return {f"eval/{k}": v for k, v in out.items()}


def token_stats(mask: np.ndarray, seconds: float) -> dict[str, float]:
    """What a step computed on real tokens, from its completions' mask [B, N, T] (host):

    tokens/real: completion tokens the update trains on (mask True);
    tokens/padding: the fraction of the update's B N T positions that are padding;
    tokens/sampler_padding: the fraction of the sampler's decode row-steps spent on rows
      that had stopped (every row runs until the batch's longest completion stops, so
      B N max_len row-steps, of which tokens/real are real);
    tokens/real_per_s: tokens/real over the step's wall seconds (the figure to compare
      across padding strategies; tokens per second over B N T would count padding).
    """
    real = int(mask.sum())
    longest = int(mask.any(axis=(0, 1)).nonzero()[0].max(initial=-1)) + 1
    rows = mask.shape[0] * mask.shape[1]
    return {
        "tokens/real": real,
        "tokens/padding": 1.0 - real / mask.size if mask.size else 0.0,
        "tokens/sampler_padding": 1.0 - real / (rows * longest) if longest else 0.0,
        "tokens/real_per_s": real / seconds if seconds > 0 else float("nan"),
    }


def step_row(
    cfg: TrainConfig,
    step: int,
    metrics: dict[str, float],
    kept: int,
    sample_batches: int,
    timing: dict[str, float],
    tallies: dict[str, int],
    votes: list[dict],
) -> dict:
    """The JSON-able metrics row of RL step `step` (0-based): the update's metrics, the
    kept fraction of the sampled groups, time/* seconds, verify/* tallies, pseudo/* means."""
    return {
        "step": step + 1,
        "k": cfg.k_at(step),
        **metrics,
        "finite": bool(metrics["finite"]),
        "kept_fraction": kept / (sample_batches * cfg.batch_prompts),
        "sample_batches": sample_batches,
        **{f"time/{n}": s for n, s in timing.items()},
        **{f"verify/{n}": count for n, count in tallies.items()},
        **{f"pseudo/{n}": float(np.nanmean([v[n] for v in votes])) for n in (votes or [{}])[0]},
    }


def pseudo_label_stats(cfg: TrainConfig, v: Verdicts) -> dict[str, float]:
    """The vote's labels against the verifier's (reward=MAJORITY_VOTE): step metrics
    pseudo/labelled, pseudo/label_wrong (a fraction of the labelled groups) and
    pseudo/reward_error (kjax.objectives.pseudo_label_stats)."""
    stats = objectives.pseudo_label_stats(
        v.answer_ids, v.target, v.scores, cfg.objective.min_agreement
    )
    return {n: float(x) for n, x in jax.device_get(stats).items()}


def postfix(row: dict, last_eval: dict, n_eval: int) -> dict[str, str]:
    shown = {
        "pass@1": last_eval.get("eval/pass@1"),
        f"pass@{n_eval}": last_eval.get(f"eval/pass@{n_eval}"),
    }
    real = row.get("tokens/real_per_s")
    return {
        "reward": f"{row['reward_mean']:.3f}",
        **({"tok/s": f"{real:.0f}", "pad": f"{row['tokens/padding']:.0%}"} if real else {}),
        **{name: f"{v:.3f}" for name, v in shown.items() if v is not None},
    }


def evals_of(row: dict) -> dict[str, float]:
    """The eval/* metrics of a metrics row (a resumed, finished run's last evaluation)."""
    return {k: v for k, v in row.items() if k.startswith("eval/")}
