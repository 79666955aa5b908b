"""Benchmark: one whole RL step of kjax vs TRL's GRPOTrainer, same model, prompts and shape.

  KJAX_TRL_PYTHON=/tmp/trlenv/bin/python python -m experiments.bench_trl \
      [--prompts=2 --samples=4 --tokens=16 --steps=3 --out=F.json]

The real SmolLM2-135M-Instruct (the smollm2_arith preset, float32) on both sides. kjax
runs first: warm-up + timed steps of kjax.rl.loop.rl_step, recording the prompts it
trains on; then bench/trl_grpo_step.py runs the same prompts, in the same order, through
GRPOTrainer in the TRL environment's python (TRL and torch never enter kjax's env).
Objective on both sides: mean reward, group-mean baseline, loss / (B N T), no KL
(kjax MEAN + GROUP_MEAN + CONSTANT_NORMALIZER = TRL dr_grpo + scale_rewards="none",
beta=0; the derivation and what still differs are in that script's docstring).
Prints a Markdown table (median step s, its sample/score/update split, TRL / kjax) and
writes --out JSON. The goal is TRL / kjax >= 2. A benchmark, not a test: on a shared CPU
the figures are noisy. Without the TRL env it exits non-zero saying how to make one.
Measured on the quiet 2-core machine (2026-12-01, nothing else running), TRL at its faster
thread count (2; 1 thread is slower when the machine is quiet), kjax's prompts fitted to the
data (S = 64; TRL's are 49 tokens unpadded): 2 x 4 x 16, two runs (the first at 2ec25f9,
before the vocabulary-chunked head: one chunk at this shape either way): kjax 5.12 / 5.50 s/step
vs TRL 10.73 / 9.24 s: 2.10x / 1.68x (the spread is the machine's); 4 x 8 x 64: kjax 43.0 s
(sample 17.4, update 24.8) vs TRL 73.1 s (sample 23.1, update 49.6): 1.70x. kjax's update
is 2.0x TRL's there; its sampler (1.3x) keeps the step under the 2x goal. Before (S = 96 and the
row-chunked head, the previous session): 1.77x and 1.63x. At a7a7897 (named residuals), 2 x 4
x 16, one run on a machine ~30% slower for both sides than the runs above: kjax 6.91 s
(sample 3.86, update 3.19) vs TRL 13.01 s (sample 5.17, update 7.83): 1.88x; the update is
2.45x TRL's, the sampler 1.34x. Same code, a later run (quieter): kjax 5.40 s (sample 2.70,
update 2.58) vs TRL 11.16 s (sample 4.42, update 6.70): 2.07x.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

import jax
import numpy as np
from absl import app, flags

from experiments.configs import smollm2_arith
from kjax.data import prompts as prompts_lib
from kjax.data.loader import Position
from kjax.models import fetch
from kjax.rl import loop
from kjax.rl.config import LossAggregation, MeanBaseline, Objective, ObjectiveConfig

flags.DEFINE_integer("prompts", 2, "B: prompts per step.")
flags.DEFINE_integer("samples", 4, "N: samples per prompt (TRL's num_generations).")
flags.DEFINE_integer("tokens", 16, "T: new tokens (TRL's max_completion_length).")
flags.DEFINE_integer("steps", 3, "Timed steps per side, after --warmup untimed ones.")
flags.DEFINE_integer("warmup", 1, "Untimed first steps per side (compilation, caches).")
flags.DEFINE_integer("prompt_tokens", 0, "kjax's prompt width S (0: the preset's: fit the data).")
flags.DEFINE_integer("threads", os.cpu_count(), "torch threads on the TRL side.")
flags.DEFINE_string("trl_python", "", "The TRL env's python (default: $KJAX_TRL_PYTHON).")
flags.DEFINE_string("out", "", "Also write the results as JSON here.")
FLAGS = flags.FLAGS

_TRL_SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "bench" / "trl_grpo_step.py"
_MAKE_ENV = (
    "`python3 -m venv /tmp/trlenv && /tmp/trlenv/bin/pip install torch==2.13.0 trl gguf`, "
    "then pass --trl_python=/tmp/trlenv/bin/python or export "
    "KJAX_TRL_PYTHON=/tmp/trlenv/bin/python"
)
KJAX_OBJECTIVE = "MEAN, GROUP_MEAN (Dr.GRPO) advantages, CONSTANT_NORMALIZER, PG, no KL"
TRL_OBJECTIVE = 'dr_grpo, scale_rewards="none", beta=0, num_iterations=1'


def trl_python() -> str:
    """The TRL env's python, checked to import trl and gguf; exits non-zero if it cannot."""
    python = FLAGS.trl_python or os.environ.get("KJAX_TRL_PYTHON", "")
    if not python:
        sys.exit(f"bench_trl: no TRL environment given. Create one: {_MAKE_ENV}.")
    try:
        probe = subprocess.run(
            [python, "-c", "import trl, gguf, datasets"], capture_output=True, text=True
        )
    except OSError as e:
        sys.exit(f"bench_trl: cannot run --trl_python={python} ({e}). Create it: {_MAKE_ENV}.")
    if probe.returncode != 0:
        sys.exit(
            f"bench_trl: {python} cannot import trl, gguf and datasets "
            f"({(probe.stderr.strip().splitlines() or ['no error text'])[-1]}). Create the "
            f"env: {_MAKE_ENV}."
        )
    return python


def config():
    """The smollm2_arith preset cut to B x N x T, with TRL's dr_grpo objective."""
    cfg = smollm2_arith.get_config("mean")
    steps = FLAGS.warmup + FLAGS.steps
    task = cfg.task
    if FLAGS.prompt_tokens:
        task = dataclasses.replace(task, max_prompt_tokens=FLAGS.prompt_tokens)
    return dataclasses.replace(
        cfg,
        name=f"bench_trl_{FLAGS.prompts}x{FLAGS.samples}x{FLAGS.tokens}",
        steps=steps,
        batch_prompts=FLAGS.prompts,
        samples=FLAGS.samples,
        max_new_tokens=FLAGS.tokens,
        objective=ObjectiveConfig(Objective.MEAN, mean_baseline=MeanBaseline.GROUP_MEAN),
        rl=dataclasses.replace(cfg.rl, aggregation=LossAggregation.CONSTANT_NORMALIZER),
        optimizer=dataclasses.replace(
            cfg.optimizer, total_steps=max(steps, cfg.optimizer.total_steps)
        ),
        task=task,
    )


class _Recorded:
    """The loop's prompt batches, each also kept in `examples` (in training order)."""

    def __init__(self, batches: loop.Batches):
        self.batches, self.examples = batches, []

    def __next__(self) -> list[dict]:
        examples = next(self.batches)
        self.examples.extend(examples)
        return examples


def run_kjax(cfg) -> tuple[dict, list[dict]]:
    """Times warmup + steps RL steps; returns (result, the prompt rows for TRL)."""
    with tempfile.TemporaryDirectory() as workdir:
        c, state = loop.build_components(cfg, workdir, log=lambda *a: None)
        lengths, sample = [], c.sampler

        def recording_sampler(*args, **kwargs):
            out = sample(*args, **kwargs)
            lengths.append(out.lengths)
            return out

        c = dataclasses.replace(c, sampler=recording_sampler)
        batches = _Recorded(loop.Batches(c.task.train, cfg.batch_prompts, cfg.seed, Position()))
        steps = []
        for i in range(cfg.steps):
            state, row = loop.rl_step(c, state, batches)
            steps.append(row)
            print(f"kjax step {i + 1}/{cfg.steps}: {row['time/step']:.2f} s", flush=True)
        c.close()
        rows = [
            {
                "prompt": [{"role": "user", "content": prompts_lib.instruction(c.task.PROMPT, e)}],
                "prompt_ids": [int(t) for t in c.task.prompt_ids(e)],
                "answer": int(e["answer"]),
            }
            for e in batches.examples
        ]
        S = c.task.prompt_len
    timed = steps[FLAGS.warmup :]

    def column(name):
        return [r[f"time/{name}"] for r in timed]

    result = {
        "steps_s": column("step"),
        "warmup_s": [r["time/step"] for r in steps[: FLAGS.warmup]],
        "median_s": statistics.median(column("step")),
        "sample_s": column("sample"),
        "score_s": [v + a for v, a in zip(column("verify"), column("advantages"), strict=True)],
        "update_s": column("update"),
        "completion_mean_length": [
            float(np.mean(jax.device_get(x))) for x in lengths[FLAGS.warmup :]
        ],
        "reward_mean": [r["reward_mean"] for r in timed],
        "config": {
            "B": cfg.batch_prompts,
            "N": cfg.samples,
            "T": cfg.max_new_tokens,
            "S": S,
            "objective": KJAX_OBJECTIVE,
            "dtype": cfg.model.dtype.value,
            "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
            "warmup": FLAGS.warmup,
        },
    }
    return result, rows


def run_trl(python: str, rows: list[dict], workdir: str) -> dict:
    """Runs bench/trl_grpo_step.py on the same prompts; its JSON result."""
    prompts_file, out = os.path.join(workdir, "prompts.json"), os.path.join(workdir, "trl.json")
    with open(prompts_file, "w") as f:
        json.dump({"prompts_per_step": FLAGS.prompts, "rows": rows}, f)
    cmd = [
        python,
        str(_TRL_SCRIPT),
        f"--gguf={fetch.gguf_path('smollm2-135m-instruct')}",
        f"--prompts={prompts_file}",
        f"--num_generations={FLAGS.samples}",
        f"--max_completion_length={FLAGS.tokens}",
        f"--steps={FLAGS.steps}",
        f"--warmup={FLAGS.warmup}",
        f"--threads={FLAGS.threads}",
        f"--learning_rate={smollm2_arith.BASE.optimizer.learning_rate}",
        f"--out={out}",
    ]
    print("TRL:", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, stdout=sys.stderr)  # keep stdout for the table
    if done.returncode != 0:
        sys.exit(f"bench_trl: the TRL side failed (exit {done.returncode}); see its output above.")
    with open(out) as f:
        return json.load(f)


def _med(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


def table(kjax: dict, trl: dict) -> str:
    k, t = kjax["config"], trl["config"]
    shape = f"{k['B']} x {k['N']} x {k['T']}"
    lines = [
        "| side | objective | B x N x T | threads | step s | sample s | score s | update s "
        "| completion tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r, objective, threads in (
        ("kjax", kjax, k["objective"], f"XLA ({os.cpu_count()} cores; {k['devices']})"),
        ("TRL", trl, TRL_OBJECTIVE, f"torch {t['threads']}"),
    ):
        lines.append(
            f"| {name} | {objective} | {shape} | {threads} | {r['median_s']:.3f} | "
            f"{_med(r['sample_s']):.3f} | {_med(r['score_s']):.3f} | "
            f"{_med(r['update_s']):.3f} | {_med(r['completion_mean_length']):.1f} |"
        )
    ratio = trl["median_s"] / kjax["median_s"]
    lines.append(
        f"\nTRL / kjax step time: {ratio:.2f}x (goal >= 2x). Medians over {FLAGS.steps} steps "
        f"after {FLAGS.warmup} warm-up; kjax prompts left-padded to S = {k['S']}, TRL's "
        f"{min(t['prompt_tokens'])}-{max(t['prompt_tokens'])} tokens unpadded."
    )
    return "\n".join(lines)


def main(argv):
    del argv
    for name in ("prompts", "samples", "tokens", "steps", "threads"):
        if getattr(FLAGS, name) < 1:
            raise app.UsageError(f"--{name} must be >= 1; got {getattr(FLAGS, name)}.")
    if FLAGS.samples < 2:
        raise app.UsageError("--samples must be >= 2 (a group baseline needs two samples).")
    python = trl_python()  # before the slow kjax side, so a missing env fails at once
    kjax, rows = run_kjax(config())
    gc.collect()  # the two sides run one after the other, never together
    jax.clear_caches()
    with tempfile.TemporaryDirectory() as workdir:
        trl = run_trl(python, rows, workdir)
    print(table(kjax, trl))
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            ratio = trl["median_s"] / kjax["median_s"]
            result = {"kjax": kjax, "trl": trl, "trl_over_kjax": ratio, "prompts": rows}
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(app.run(main))
