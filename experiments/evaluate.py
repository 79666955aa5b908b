"""Score a trained checkpoint on a task's held-out problems: per category, the unbiased
pass@k, max@k and maj@k over n samples per problem.

  python -m experiments.evaluate --workdir=RUN [--task=KIND] [--task.FIELD=VALUE ...]
      [--n=16] [--problems=200] [--temperature=1.0] [--max_new_tokens=M] [--seed=0]

RUN is a training run's workdir (experiment.json + checkpoints/). Without --task the run
is scored on its own task's test split; with one, on that task (kjax.tasks; its fields as
--task.FIELD=VALUE), e.g. LiveBench's math and reasoning questions from a local copy:

  python -m experiments.evaluate --workdir=RUN --task=livebench --task.manual_dir=DIR \\
      --n=8 --max_new_tokens=1024

A sample is correct when its score is 1; pass@k is the unbiased estimate from n >= k
samples (Chen et al. 2021), max@k the expected best of k scores, maj@k majority voting
over answer classes. Prints a Markdown table and writes RUN/evaluate/<task>.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax
import numpy as np

from kjax import checkpoint, evaluation, files, tasks
from kjax.rewards.verdict import Verdicts
from kjax.rl import multihost
from kjax.rl.config import override


def parse(argv=None) -> tuple[argparse.Namespace, dict[str, str]]:
    p = argparse.ArgumentParser(prog="experiments.evaluate", description=__doc__.split("\n")[0])
    p.add_argument("--workdir", required=True, help="a training run's workdir")
    p.add_argument("--task", default=None, help=f"task kind ({', '.join(tasks.kinds())})")
    p.add_argument("--n", type=int, default=16, help="samples per problem")
    p.add_argument("--problems", type=int, default=200, help="held-out problems (at most)")
    p.add_argument("--temperature", type=float, default=None, help="default: the run's eval")
    p.add_argument("--max_new_tokens", type=int, default=None, help="default: the run's")
    p.add_argument("--seed", type=int, default=0)
    args, rest = p.parse_known_args(argv)
    fields = {}
    for item in rest:
        name, eq, value = item.partition("=")
        if not (name.startswith("--task.") and eq):
            p.error(f"unknown argument {item!r}; task fields are --task.FIELD=VALUE")
        fields[name.removeprefix("--task.")] = value
    if args.n < 1 or args.problems < 1:
        p.error(f"--n and --problems must be >= 1; got {args.n} and {args.problems}")
    if args.temperature is not None and not args.temperature > 0:  # NaN too
        p.error(
            f"--temperature must be > 0; got {args.temperature} (sampling divides the logits "
            "by it; for near-greedy decoding give a small value such as 0.01)"
        )
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        p.error(f"--max_new_tokens must be >= 1 (left out: the run's); got {args.max_new_tokens}.")
    run = pathlib.Path(args.workdir)
    if not (run / "experiment.json").is_file():
        p.error(f"--workdir={args.workdir}: no experiment.json (a training run's workdir?)")
    if not checkpoint.has_checkpoint(run / "checkpoints"):
        p.error(
            f"--workdir={args.workdir}: no checkpoint in {run / 'checkpoints'} (the run saved "
            "none yet); train it first (python -m experiments.train ... --workdir=same) or "
            "give a run that has one"
        )
    return args, fields


def task_config(run_dir: pathlib.Path, kind: str | None, fields: dict[str, str]):
    """The run's own task config, or `kind`'s defaults, with fields set from strings."""
    own = tasks.config_from_json(json.loads((run_dir / "experiment.json").read_text())["task"])
    base = own if kind is None or kind == own.kind else tasks.config_class(kind)()
    return override(base, fields, "task.")


def by_category(examples, scores, answers) -> dict[str, dict[str, float]]:
    """{category: metrics} with "all" first; the category is the example's, else "all"."""
    names = [str(e.get("category") or "all") for e in examples]
    groups = {"all": np.arange(len(examples))}
    for name in sorted(set(names) - {"all"}):
        groups[name] = np.flatnonzero(np.asarray(names) == name)
    out = {}
    for name, rows in groups.items():
        v = Verdicts(scores[rows], answers[rows], np.zeros(len(rows), np.int32))
        out[name] = {"problems": len(rows), **evaluation.group_metrics(v)}
    return out


def markdown(results: dict[str, dict[str, float]], n: int) -> str:
    ks = evaluation.k_values(n)
    head = ["category", "problems", *(f"pass@{k}" for k in ks), f"max@{n}", f"maj@{n}"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, m in results.items():
        cells = [f"{m[f'pass@{k}']:.3f}" for k in ks] + [
            f"{m[f'max@{n}']:.3f}",
            f"{m[f'maj@{n}']:.3f}",
        ]
        lines.append(f"| {name} | {m['problems']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from absl import logging

    from experiments.tables import inference_strategies as infer

    args, fields = parse(argv)
    logging.set_verbosity(logging.ERROR)
    run_dir = pathlib.Path(args.workdir)
    try:
        multihost.device_count()  # JAX_PLATFORMS naming a backend this machine lacks
        task_cfg = task_config(run_dir, args.task, fields)
        policy = infer.load_policy(run_dir, problems=args.problems, task=task_cfg)
    except (ValueError, FileNotFoundError) as e:
        print(f"experiments.evaluate: error: {e}", file=sys.stderr)
        return 2
    cfg = policy.cfg
    temperature = cfg.eval.temperature if args.temperature is None else args.temperature
    tokens = cfg.max_new_tokens if args.max_new_tokens is None else args.max_new_tokens
    examples = list(policy.task.test)[: args.problems]
    if len(examples) < args.problems:
        print(
            f"note: --problems={args.problems} but {task_cfg.kind}'s test split has "
            f"{len(examples)} problems; scoring those {len(examples)}.",
            file=sys.stderr,
        )
    key = jax.random.key(args.seed)
    d = infer.draw(policy, policy.task, examples, args.n, temperature, tokens, key)
    results = by_category(examples, d.scores, d.answers)
    title = (
        f"{run_dir} on {task_cfg.kind}: {len(examples)} problems x {args.n} samples at "
        f"T={temperature}, {tokens} new tokens at most"
    )
    text = f"{title}\n\n{markdown(results, args.n)}\n"
    out = run_dir / "evaluate"
    try:
        out.mkdir(exist_ok=True)
        files.write_atomic(out / f"{task_cfg.kind}.md", text)
        files.write_atomic(out / f"{task_cfg.kind}.json", json.dumps(results, indent=1))
    except OSError as e:
        print(text)
        print(f"experiments.evaluate: error: cannot write {out}: {e.strerror}", file=sys.stderr)
        return 2
    print(text)
    print(f"wrote {out}/{task_cfg.kind}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
