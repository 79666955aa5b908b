"""Inference-time strategies on a trained policy: best-of-N selectors and sample allocation.

  python -m experiments.tables.inference_strategies --workdir=DIR [--checkpoint=RUN_DIR ...]
      [--smoke]

RUN_DIR is a training run's workdir (experiment.json + checkpoints/, as written by
kjax.rl.loop.train_and_evaluate); each one is evaluated on its own task's held-out
problems (give --checkpoint once per run). Default: the quickstart's pass@k run
(tiny_arith `passk`, trained into DIR/quickstart if absent, ~2-5 min on 2 CPU cores) and
a countdown max@k run (tiny_countdown `maxk`, trained into DIR/countdown if absent,
~4 min). For each, with N samples per problem at the run's eval temperature:
accuracy vs n for every selector (exact U-statistics: kjax.inference.best_of_n_accuracy,
maj@k, Borda averaged over subsets), and the sample allocation over temperatures
{0.4, 0.7, 1.0} fitted on training problems against the best single temperature at the
same budget, valued on held-out problems (unbiased estimator). Writes DIR/inference.md,
DIR/accuracy_vs_n.png and DIR/results.json. --smoke: random-init tiny policies for
arithmetic and countdown, a few problems (< 60 s on CPU; exercises every path). A sample
counts as correct when its reward is 1 (countdown: an exact hit; near misses score less).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kjax import checkpoint, evaluation, inference, objectives, sharding, tasks
from kjax.data import loader
from kjax.files import write_atomic, write_figure
from kjax.models import llama, lora
from kjax.rl import task as task_lib
from kjax.rl.config import (
    ArithConfig,
    CountdownConfig,
    EvalConfig,
    ModelConfig,
    ModelKind,
    TrainConfig,
    to_json,
)
from kjax.sampling import sample_params

TEMPERATURES = (0.4, 0.7, 1.0)
CHUNK = 32  # prompts per sampler call (one compilation per task)


@dataclasses.dataclass(frozen=True)
class Setup:
    samples: int = 32  # N per held-out problem (curves) and per problem and temperature
    problems: int = 200  # held-out problems per task (curves and allocation value)
    train_problems: int = 200  # problems the allocation's success rates come from
    budgets: tuple[int, ...] = (2, 4, 8, 16)  # samples per problem (unit cost each)
    borda_subsets: int = 64
    seed: int = 0


SMOKE = Setup(samples=4, problems=8, train_problems=8, budgets=(2, 4), borda_subsets=8)


@dataclasses.dataclass(frozen=True)
class Policy:
    """A trained model and its task. vocab_size: the tokenizer's true vocabulary."""

    cfg: TrainConfig
    model_config: Any
    params: Any
    task: Any  # kjax.rl.task.Task
    vocab_size: int


def load_policy(run_dir, *, problems: int, restore: bool = True, task=None) -> Policy:
    """The one place that knows the trainer's layout: experiment.json (to_json of the
    TrainConfig), checkpoints/ holding a TrainState, the dataset under data/, and
    kjax.rl.components.build_model for the architecture and tokenizer. task: a task config
    to evaluate on instead of the run's own (a TINY model only reads its own characters)."""
    from kjax.rl.components import build_model

    run_dir = pathlib.Path(run_dir)
    ident = json.loads((run_dir / "experiment.json").read_text())
    cfg = TrainConfig(
        name=ident["name"],
        model=ModelConfig(**ident["model"]),
        task=tasks.config_from_json(ident["task"]),
        eval=EvalConfig(**{**ident["eval"], "problems": problems}),
        max_new_tokens=ident["max_new_tokens"],
        seed=ident["seed"],
    )
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    built = {}

    def init():
        built["config"], params, built["tokenizer"] = build_model(cfg, mesh)
        return params

    # Restoring needs only the architecture: trace the initialization, never run it.
    params = jax.eval_shape(init) if restore else init()
    model_config, tokenizer = built["config"], built["tokenizer"]
    if restore:
        if not checkpoint.has_checkpoint(run_dir / "checkpoints"):  # and create nothing there
            raise FileNotFoundError(
                f"no checkpoint in {run_dir}/checkpoints; train the run first (experiments.train)"
            )
        one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        if cfg.model.lora.enabled:  # a LoRA run's checkpoint holds the adapters only
            key = jax.random.key(0)
            params = jax.eval_shape(lambda: lora.split(lora.attach(init(), cfg.model.lora, key))[0])
        like = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one), params)
        params, step = checkpoint.read_params(run_dir / "checkpoints", like)
        if cfg.model.lora.enabled:
            base_id = checkpoint.read_meta(run_dir / "checkpoints", step).get("lora_base")
            params = _on_lora_base(cfg, ident, run_dir, params, base_id, init)
    if task is not None and task != cfg.task:
        if (
            cfg.model.kind is ModelKind.TINY
            and task_lib.tiny_tokenizer(dataclasses.replace(cfg, task=task)) != tokenizer
        ):
            raise ValueError(
                f"the run's character model reads {cfg.task.kind}'s characters, not "
                f"{task.kind}'s; evaluate it on {cfg.task.kind} or use a run trained on "
                f"{task.kind}."
            )
        cfg = dataclasses.replace(cfg, task=task)
    task = task_lib.load_task(cfg, tokenizer, run_dir / "data")
    vocab = min(getattr(task.tokenizer, "vocab_size", None) or 1 << 62, model_config.vocab_size)
    return Policy(cfg, model_config, params, task, vocab)


def _on_lora_base(cfg, ident: dict, run_dir: pathlib.Path, adapters, base_id, init):
    """A LoRA run's checkpointed adapters joined to its frozen base, rebuilt as the run
    built it (the model, then the cached SFT warm start if the run had one), refused
    unless its fingerprint is the one the checkpoint recorded."""
    base = init()
    sft = ident.get("sft", {})
    if sft.get("steps"):
        cached = pathlib.Path(sft.get("cache_dir") or run_dir / "sft") / "params"
        ckpt = checkpoint.Checkpointer(cached, checkpoint.CheckpointConfig(async_save=False))
        with ckpt:
            if ckpt.latest_step() is None:
                raise FileNotFoundError(
                    f"{run_dir} is a LoRA run on an SFT warm start, whose cache {cached} is "
                    "gone: rerun experiments.train with the same config to rebuild it"
                )
            base = ckpt.restore({"params": base})[0]["params"]
    frozen = lora.split(lora.attach(base, cfg.model.lora, jax.random.key(0)))[1]
    if not lora.same_base(base_id, frozen, lora.fingerprint(frozen)):
        raise ValueError(
            f"{run_dir}'s LoRA adapters were trained on the base with fingerprint {base_id}, "
            f"but the base rebuilt from its config has {lora.fingerprint(frozen)}: the model "
            "file or the SFT warm start changed; restore the original base"
        )
    return lora.join(adapters, jax.device_put(frozen, jax.devices()[0]))


@functools.partial(jax.jit, static_argnames=("config",))
def completion_logits(params, prompts_, pmask, tokens, *, config):
    """Logits [B,N,T,V] at each completion position (prompt repeated per sample)."""
    B, N, T = tokens.shape
    S = prompts_.shape[1]
    seq = jnp.concatenate([jnp.repeat(prompts_, N, 0), tokens.reshape(B * N, T)], axis=1)
    attn = jnp.concatenate([jnp.repeat(pmask, N, 0), jnp.ones((B * N, T), bool)], axis=1)
    logits = llama.forward(params, config, seq, attention_mask=attn)
    return logits[:, S - 1 : S + T - 1].reshape(B, N, T, -1)


@dataclasses.dataclass(frozen=True)
class Draw:
    """N samples of B problems. texts [B][N]; scores, answers [B,N] (verifier);
    certainty [B,N] (self-certainty); loglik [B,N] (mean token log-prob at T=1)."""

    texts: list[list[str]]
    scores: np.ndarray
    answers: np.ndarray
    certainty: np.ndarray
    loglik: np.ndarray

    @property
    def correct(self) -> np.ndarray:
        return self.scores >= 1.0


def draw(
    policy: Policy,
    task,
    examples: Sequence[dict],
    n: int,
    temperature: float,
    max_new_tokens: int,
    key,
) -> Draw:
    """Samples n completions of each example in chunks of CHUNK prompts and verifies them."""
    tokens, masks, certs, logliks = [], [], [], []
    for start in range(0, len(examples), CHUNK):
        chunk = list(examples[start : start + CHUNK])
        real = len(chunk)
        chunk += [chunk[-1]] * (CHUNK - real)  # fixed shapes: one compilation
        p, m = task_lib.prompt_batch(task, chunk)
        ro = sample_params(
            policy.params,
            p,
            m,
            jax.random.fold_in(key, start),
            jnp.float32(temperature),
            config=policy.model_config,
            n=n,
            max_new_tokens=max_new_tokens,
            stop_ids=task.stop_ids,
        )
        logits = completion_logits(policy.params, p, m, ro.tokens, config=policy.model_config)
        cert = inference.self_certainty(logits, ro.mask, policy.vocab_size)
        lp = jnp.sum(jnp.where(ro.mask, ro.model_logprobs, 0.0), -1) / jnp.maximum(ro.lengths, 1)
        for out, x in ((tokens, ro.tokens), (masks, ro.mask), (certs, cert), (logliks, lp)):
            out.append(np.asarray(x)[:real])
    tokens, masks = np.concatenate(tokens), np.concatenate(masks)
    texts = task_lib.decode(task, tokens, masks)
    v = task.verify(texts, examples)
    return Draw(texts, v.scores, v.answer_ids, np.concatenate(certs), np.concatenate(logliks))


SELECTORS = (
    "verifier score",
    "reward: mean log-likelihood",
    "self-certainty",
    "majority vote",
    "Borda (self-certainty, p=1)",
)


def accuracy_vs_n(d: Draw, *, subsets: int, key) -> dict[str, dict[int, float]]:
    """{selector: {n: mean accuracy over problems}} for n in 1, 2, 4, ..., N."""
    correct = jnp.asarray(d.correct)
    answers = jnp.asarray(d.answers)
    by_score = {
        "verifier score": d.scores,
        "reward: mean log-likelihood": d.loglik,
        "self-certainty": d.certainty,
    }
    target = jnp.zeros(len(d.scores), jnp.int32)  # kjax verdicts: the reference is class 0
    stacked = np.concatenate(list(by_score.values()))  # one call (one compile) per n
    B = len(d.scores)
    out = {name: {} for name in SELECTORS}
    for n in evaluation.k_values(d.scores.shape[1]):
        acc = inference.best_of_n_accuracy(stacked, jnp.tile(correct, (len(by_score), 1)), n)
        for i, name in enumerate(by_score):
            out[name][n] = float(jnp.mean(acc[i * B : (i + 1) * B]))
        out["majority vote"][n] = float(jnp.mean(objectives.majority_at_k(answers, target, n)))
        borda = inference.subset_accuracy(
            inference.select_by_borda,
            (d.certainty, answers),
            correct,
            n,
            key=key,
            max_subsets=subsets,
        )
        out["Borda (self-certainty, p=1)"][n] = float(jnp.mean(borda))
    return out


def allocation_rows(train: list[Draw], test: list[Draw], budgets, n: int) -> list[dict]:
    """Per budget: the allocation fitted on train draws vs the single temperature that is
    best on train, both valued on test draws (unbiased); plus the best single on test."""
    success = np.stack([d.correct.mean(1) for d in train], axis=1)  # [P, C]
    k_test = np.stack([d.correct.sum(1) for d in test], axis=1)
    C, rows = len(train), []
    for b in budgets:
        counts = inference.allocate(success, np.ones(C), b)
        singles = [np.eye(C, dtype=np.int64)[c] * b for c in range(C)]
        pick = int(np.argmax([inference.allocation_value(success, x) for x in singles]))
        held = [inference.unbiased_allocation_value(k_test, n, x) for x in singles]
        rows.append(
            {
                "budget": b,
                "counts": counts.tolist(),
                "allocation": inference.unbiased_allocation_value(k_test, n, counts),
                "single_temperature": TEMPERATURES[pick],
                "single": held[pick],
                "best_single_on_test": max(held),
            }
        )
    return rows


def run(policies: Sequence[Policy], setup: Setup) -> dict:
    """{task name: curves, allocation rows, an example} for each policy on its own task."""
    key = jax.random.key(setup.seed)
    names = [p.cfg.task.kind for p in policies]
    entries = {
        (name if names.count(name) == 1 else f"{name} ({p.cfg.name})"): (
            p,
            p.task,
            p.cfg.max_new_tokens,
        )
        for name, p in zip(names, policies, strict=True)
    }
    results = {}
    for t, (name, (policy, task, tokens)) in enumerate(entries.items()):
        test = list(task.test)[: setup.problems]
        train = [loader.decode(task.train[i]) for i in range(setup.train_problems)]
        k = jax.random.fold_in(key, t)
        main = draw(policy, task, test, setup.samples, policy.cfg.eval.temperature, tokens, k)
        curves = accuracy_vs_n(main, subsets=setup.borda_subsets, key=k)
        draws = {
            s: [
                draw(
                    policy,
                    task,
                    ex,
                    setup.samples,
                    temp,
                    tokens,
                    jax.random.fold_in(k, 100 * (c + 1) + i),
                )
                for c, temp in enumerate(TEMPERATURES)
            ]
            for i, (s, ex) in enumerate((("train", train), ("test", test)))
        }
        rows = allocation_rows(draws["train"], draws["test"], setup.budgets, setup.samples)
        results[name] = {
            "run": policy.cfg.name,
            "temperature": policy.cfg.eval.temperature,
            "curves": curves,
            "allocation": rows,
            "examples": [(test[0], main.texts[0][:4], main.scores[0][:4].tolist())],
        }
    return results


def markdown(results: dict, setup: Setup) -> str:
    lines = []
    for name, r in results.items():
        ns = sorted(next(iter(r["curves"].values())))
        lines += [
            f"### {name}: accuracy vs N ({setup.problems} held-out problems, "
            f"{setup.samples} samples each at T={r['temperature']}; run {r['run']})",
            "",
            "| selector | " + " | ".join(f"N={n}" for n in ns) + " |",
            "|---|" + "---|" * len(ns),
        ]
        for sel, curve in r["curves"].items():
            lines.append(f"| {sel} | " + " | ".join(f"{curve[n]:.3f}" for n in ns) + " |")
        lines += [
            "",
            f"### {name}: allocation over T={list(TEMPERATURES)} (fitted on "
            f"{setup.train_problems} training problems; held-out value, unbiased)",
            "",
            "| budget | counts | allocation | best single T (on train) | its value |"
            " best single on held-out |",
            "|---|---|---|---|---|---|",
        ]
        for a in r["allocation"]:
            lines.append(
                f"| {a['budget']} | {a['counts']} | {a['allocation']:.3f} | "
                f"{a['single_temperature']} | {a['single']:.3f} | "
                f"{a['best_single_on_test']:.3f} |"
            )
        lines.append("")
    return "\n".join(lines)


def plot(results: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items(), strict=True):
        for sel, curve in r["curves"].items():
            ns = sorted(curve)
            ax.plot(ns, [curve[n] for n in ns], marker="o", label=sel)
        ax.set(
            xscale="log",
            xlabel="N (samples per problem)",
            ylabel="accuracy of the pick",
            title=name,
            ylim=(0, 1),
        )
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    write_figure(fig, path, dpi=120)
    plt.close(fig)


SMOKE_TASKS = {
    "arith": ArithConfig(train_size=64, test_size=16),
    "countdown": CountdownConfig(train_size=64, test_size=16),
}


def smoke_run(workdir: pathlib.Path, kind: str = "arith") -> pathlib.Path:
    """A random-init tiny policy for one task, written in the trainer's run layout (no
    training)."""
    run_dir = workdir / f"smoke_{kind}"
    cfg = TrainConfig(name=f"smoke_{kind}", task=SMOKE_TASKS[kind], eval=EvalConfig(problems=8))
    checkpoint.ensure_workdir(run_dir, to_json(cfg))
    policy = load_policy(run_dir, problems=8, restore=False)
    with checkpoint.Checkpointer(run_dir / "checkpoints", checkpoint.CheckpointConfig()) as c:
        c.save(1, {"params": policy.params, "step": jnp.int32(0)}, {}, force=True)
        c.wait()
    return run_dir


def _trained(cfg: TrainConfig, run_dir: pathlib.Path, what: str) -> pathlib.Path:
    from kjax.rl.loop import train_and_evaluate

    if not (run_dir / "checkpoints").is_dir() or not any((run_dir / "checkpoints").iterdir()):
        print(f"training {what} into {run_dir} (a few minutes)")
        train_and_evaluate(cfg, run_dir, progress=False)
    return run_dir


def default_runs(workdir: pathlib.Path) -> list[pathlib.Path]:
    """The quickstart's pass@k run (arithmetic) and tiny_countdown's max@k run, trained
    under workdir if absent."""
    from experiments import quickstart
    from experiments.configs import tiny_countdown

    arith = quickstart.configs(workdir / "quickstart")["pass@k (k=8)"]
    countdown = tiny_countdown.get_config("maxk")
    return [
        _trained(arith, workdir / "quickstart" / arith.name, "the quickstart's pass@k run"),
        _trained(countdown, workdir / "countdown", "tiny_countdown's max@k run"),
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="experiments.tables.inference_strategies")
    parser.add_argument("--workdir", required=True)
    parser.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        help="a training run's workdir (repeat for several runs, each on its own task)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny random policies, < 60 s")
    args = parser.parse_args(argv)
    from absl import logging

    logging.set_verbosity(logging.ERROR)
    workdir = pathlib.Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    setup = SMOKE if args.smoke else Setup()
    run_dirs = [pathlib.Path(c) for c in args.checkpoint]
    for run_dir in run_dirs:
        if not (run_dir / "experiment.json").is_file():
            parser.error(f"--checkpoint={run_dir}: no experiment.json (a training workdir?)")
    if not run_dirs:
        smoke = [smoke_run(workdir, kind) for kind in SMOKE_TASKS]
        run_dirs = smoke if args.smoke else default_runs(workdir)
    policies = [load_policy(run_dir, problems=setup.problems) for run_dir in run_dirs]
    results = run(policies, setup)
    text = markdown(results, setup)
    runs = "\n".join(f"- {r}" for r in run_dirs)
    write_atomic(workdir / "inference.md", f"policies:\n{runs}\n\n{text}")
    write_atomic(workdir / "results.json", json.dumps(results, indent=1, default=str))
    plot(results, workdir / "accuracy_vs_n.png")
    print(text)
    print(f"wrote {workdir}/inference.md, accuracy_vs_n.png, results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
