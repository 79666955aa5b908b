"""Benchmark: the whole RL step padded vs packed + compacting (issue 45), alternating in one run.

  python -m experiments.bench.bench_padding [--shapes=smollm2,tiny_countdown] [--steps=3]
      [--warmup=1] [--compact_floor=8] [--out=F.json] [--smoke]

Two arms of kjax.rl.loop.rl_step (sample, verify, advantages, update), built from one run:
"padded" is today's default (rl.pack OFF, sampler_compact_floor 0), "packed" is rl.pack
GROUP (kjax.rl.packing) with the compacting sampler (sampler_compact_floor = --compact_floor,
kjax.sampling.compact_sizes). Every step both arms start from the same train state (the
padded arm's trajectory; the packed arm's new state is dropped), draw the same prompts and
use the same sampling key, padded first then packed; so every step is a paired comparison
on the same parameters, and the compacting sampler, token-identical to the static one for
the same key, should give both arms the same tokens (reported per step: `same tokens`).
The first --warmup steps compile and are not timed; a packed update bucket first seen in a
timed step is compiled ahead of its call (AOT) and those seconds are taken off that step.
Shapes: smollm2, the real SmolLM2-135M-Instruct (experiments/configs/smollm2_arith.py,
float32) at 4 prompts x 8 samples x 128 tokens with bench_trl's objective (Dr.GRPO, no
KL); tiny_countdown, the random-init char model of experiments/configs/tiny_countdown.py at
16 x 16 x 128 (experiments.bench.pack_update's batches; no SFT warm start, so the lengths
are that model's). A step whose advantages are all 0 (every group's scores equal: always so
for a random-init model, which scores 0) gets standard normal ones, seeded by the step, in
both arms alike (recorded per step): the update's cost does not depend on their values, and
its loss and gradient norm then compare the arms.
Reported per step: completion lengths, the padding fraction of the sampler's decode
row-steps (kjax.sampling.decode_row_steps: sizes B*N static, the compact sizes compacting)
and of the update's positions (1 - real / (B N T) padded, / (B R T) packed with R rows per
group), real completion tokens per second of the whole step; per arm the medians of the
step and its sample / score (verify + advantages) / update split, and the padded / packed
ratio (the issue's goal for smollm2: >= 1.5x). With the machine: its float32 matmul peak
(experiments.lab.provenance.matmul_peak), CPU model and load average.
--compact_floor 8 by default, reasoned, not measured: on CPU a SmolLM2 decode step of
fewer rows than that is mostly reading the weights (0.54 GB of float32 a step), so halving
below 8 rows saves little, while each further size adds one more copy of the decode loops
to compile. 0: the packed arm packs the update only and samples with the static sampler.
--smoke (seconds; the default test tier runs it with --compact_floor 0, the slow tier as
is): tiny_arith at 8 x 4 x 16, one warm-up and one timed step. smollm2 needs ~8.5 GB of RAM
(two train states at a step). Figures: docs/performance.md. A benchmark, not a test: on a
shared CPU the figures are noisy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench import bench_trl, pack_update
from experiments.lab.provenance import cpu_model, git_commit, matmul_peak
from kjax import sampling, sharding
from kjax.data import loader
from kjax.rl import loop, packing
from kjax.rl.components import step_and_sampler
from kjax.rl.config import PackMode, TrainConfig

ARMS = ("padded", "packed")
SHAPES = ("smollm2", "tiny_countdown", "tiny_arith")
SMOKE = {"shapes": "tiny_arith", "steps": 1, "warmup": 1, "tokens": 16}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="experiments.bench.bench_padding", description=__doc__.split("\n")[0]
    )
    p.add_argument("--shapes", default=",".join(SHAPES), help="smollm2 and/or tiny_countdown")
    p.add_argument("--steps", type=int, default=3, help="timed steps (each arm, alternating)")
    p.add_argument("--warmup", type=int, default=1, help="untimed first steps (compiles)")
    p.add_argument("--tokens", type=int, default=128, help="T: the completion cap")
    p.add_argument(
        "--compact_floor", type=int, default=8, help="the packed arm's sampler floor (0: off)"
    )
    p.add_argument("--out", default="", help="also write the results as JSON here")
    p.add_argument("--smoke", action="store_true", help="tiny_countdown, 8 x 4 x 16, 1 step")
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    args.shapes = [s for s in args.shapes.split(",") if s]
    for shape in args.shapes:
        if shape not in SHAPES:
            p.error(f"--shapes: unknown shape {shape!r}; choose from {', '.join(SHAPES)}.")
    for name in ("steps", "warmup", "tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1; got {getattr(args, name)}.")
    if args.compact_floor < 0:
        p.error(f"--compact_floor must be >= 0 (0: pack only); got {args.compact_floor}.")
    return args


def config(shape: str, args: argparse.Namespace) -> TrainConfig:
    """The padded arm's run: smollm2 as bench_trl builds it at 4 x 8 x T, tiny_countdown
    as pack_update does (16 x 16, or its smoke's 8 x 4)."""
    steps = args.warmup + args.steps
    if shape == "smollm2":
        cfg = bench_trl.config(
            argparse.Namespace(smoke=False, prompts=4, samples=8, tokens=args.tokens,
                               steps=args.steps, warmup=args.warmup, lora=0, prompt_tokens=0)
        )  # fmt: skip
    else:
        cfg = pack_update.config(shape, args.tokens, args.smoke)
    optimizer = dataclasses.replace(
        cfg.optimizer, total_steps=max(steps, cfg.optimizer.total_steps)
    )
    return dataclasses.replace(cfg, name=f"bench_padding_{shape}", steps=steps,
                               optimizer=optimizer)  # fmt: skip


def packed_config(cfg: TrainConfig, floor: int) -> TrainConfig:
    return dataclasses.replace(
        cfg, rl=dataclasses.replace(cfg.rl, pack=PackMode.GROUP), sampler_compact_floor=floor
    )


class _Arm:
    """One arm's components, wrapped to record what each step sampled, the update's rows R
    and the seconds spent compiling a new packed bucket inside a step."""

    def __init__(self, c: loop.Components, cfg: TrainConfig, shards: int):
        self.cfg, self.record = cfg, {}
        B, N = cfg.batch_prompts, cfg.samples
        floor = cfg.sampler_compact_floor
        self.sizes = sampling.compact_sizes(B * N, floor, shards) if floor else (B * N,)
        self.batches = loop.Batches(c.task.train, B, cfg.seed, loader.Position())
        self.compiled: set[int] = set()
        step_fn, sample, advantages = c.step_fn, c.sampler, c.advantages

        def sampler(*a, **kw):
            out = sample(*a, **kw)
            self.record["rollouts"] = out
            return out

        def step(state, batch, ref_params, k):
            if isinstance(step_fn, packing.PackedStep):
                rows = step_fn.rows_of(batch)
                jitted, extra = step_fn.jitted, (rows,)
            else:
                rows, jitted, extra = batch.tokens.shape[1], step_fn, ()
            self.record["rows"], self.record["compile_s"] = rows, 0.0
            if rows not in self.compiled:  # compile ahead, so the seconds can be taken off
                t = time.perf_counter()
                jitted.lower(state, batch, ref_params, k, *extra).compile()
                self.record["compile_s"] = time.perf_counter() - t
                self.compiled.add(rows)
            return jitted(state, batch, ref_params, k, *extra)

        def scored(*a, **kw):
            adv = np.asarray(advantages(*a, **kw))
            self.record["substituted_advantages"] = not np.any(adv)
            if not np.any(adv):  # no signal (an untrained model); the update's cost is the same
                rng = np.random.default_rng(self.record["step"])
                adv = rng.standard_normal(adv.shape).astype(np.float32)
            return adv

        self.c = dataclasses.replace(c, cfg=cfg, step_fn=step, sampler=sampler,
                                     advantages=scored)  # fmt: skip

    def step(self, state, i: int):
        """rl_step from state (donated) at step i; (new state, this step's figures)."""
        self.record = {"step": i}
        state, row = loop.rl_step(self.c, state, self.batches)
        r, cfg = self.record, self.cfg
        out = jax.device_get(r["rollouts"])
        B, T = cfg.batch_prompts, cfg.max_new_tokens
        real = int(row["tokens/real"])
        live, run = sampling.decode_row_steps(out.lengths, self.sizes)
        seconds = {
            "step": row["time/step"] - r["compile_s"],
            "sample": row["time/sample"],
            "score": row["time/verify"] + row["time/advantages"],
            "update": row["time/update"] - r["compile_s"],
        }
        return state, {
            "seconds": seconds,
            "compile_excluded_s": r["compile_s"],
            "rows": r["rows"],
            "real_tokens": real,
            "real_tokens_per_s": real / seconds["step"],
            "update_padding": 1.0 - real / (B * r["rows"] * T),
            "sampler_padding": 1.0 - live / run if run else 0.0,
            "mean_length": float(np.mean(out.lengths)),
            "max_length": int(np.max(out.lengths)),
            "at_cap": float(np.mean(out.lengths == T)),
            "loss": row["loss"],
            "grad_norm": row["grad_norm"],
            "reward_mean": row["reward_mean"],
            "substituted_advantages": r["substituted_advantages"],
            "tokens": np.asarray(out.tokens),
        }


def compare(shape: str, args: argparse.Namespace) -> dict:
    """Times warmup + steps RL steps of both arms, alternating, from one shared state."""
    cfg = config(shape, args)
    with tempfile.TemporaryDirectory() as workdir:
        c, state = loop.build_components(cfg, workdir, log=lambda *a: None)
        with jax.sharding.use_abstract_mesh(c.mesh.abstract_mesh):
            shards = sharding.batch_shards()
        pcfg = packed_config(cfg, args.compact_floor)
        step_fn, sampler = step_and_sampler(pcfg, c.model_config, c.mesh, state, c.task)
        arms = {
            "padded": _Arm(c, cfg, shards),
            "packed": _Arm(dataclasses.replace(c, step_fn=step_fn, sampler=sampler), pcfg, shards),
        }
        steps = []
        for i in range(cfg.steps):
            copy = jax.block_until_ready(jax.tree.map(jnp.copy, state))
            new, padded = arms["padded"].step(copy, i)
            dropped, packed = arms["packed"].step(state, i)  # its input is donated
            del dropped  # only the padded arm's new state goes on
            state = new
            same = bool(np.array_equal(padded.pop("tokens"), packed.pop("tokens")))
            steps.append({"step": i + 1, "timed": i >= args.warmup, "same_tokens": same,
                          "loss_diff": abs(padded["loss"] - packed["loss"]),
                          "grad_norm_diff": abs(padded["grad_norm"] - packed["grad_norm"]),
                          "padded": padded, "packed": packed})  # fmt: skip
            print(f"{shape} step {i + 1}/{cfg.steps}: padded {padded['seconds']['step']:.2f} s, "
                  f"packed {packed['seconds']['step']:.2f} s, same tokens {same}",
                  flush=True)  # fmt: skip
        c.close()
        S = c.task.prompt_len
    timed = [s for s in steps if s["timed"]]
    summary = {arm: _summary([s[arm] for s in timed]) for arm in ARMS}
    ratio = {n: summary["padded"][f"{n}_s"] / summary["packed"][f"{n}_s"]
             for n in ("step", "sample", "update")}  # fmt: skip
    return {
        "shape": shape, "B": cfg.batch_prompts, "N": cfg.samples, "T": cfg.max_new_tokens,
        "S": S, "compact_floor": args.compact_floor, "compact_sizes": list(arms["packed"].sizes),
        "buckets": list(packing.buckets(cfg.samples)), "warmup": args.warmup,
        "steps": steps, "summary": summary, "padded_over_packed": ratio,
        "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
    }  # fmt: skip


def _summary(rows: list[dict]) -> dict:
    """Medians over the timed steps of an arm (padding fractions: means)."""
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    out = {f"{n}_s": med([r["seconds"][n] for r in rows]) for n in rows[0]["seconds"]}
    out["real_tokens_per_s"] = med([r["real_tokens_per_s"] for r in rows])
    for n in ("update_padding", "sampler_padding"):
        out[n] = float(np.mean([r[n] for r in rows]))
    return out


def table(result: dict, machine: dict) -> str:
    """Per-step and per-arm Markdown tables of one shape."""
    r = result
    lines = [
        f"{r['shape']}: B x N x T = {r['B']} x {r['N']} x {r['T']} (S = {r['S']}), compact "
        f"sizes {r['compact_sizes']}, packed rows from {r['buckets']}; {r['devices']}\n",
        "| step | mean / max length (at cap) | same tokens | padded s (sample / update) "
        "| packed s (sample / update) | sampler padding padded / packed "
        "| update padding padded / packed (R of N) | real tok/s padded / packed "
        "| loss, grad norm: |diff| |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in r["steps"]:
        a, b = s["padded"], s["packed"]
        step = f"{s['step']}" + ("" if s["timed"] else " (warm-up)")
        lines.append(
            f"| {step} | {a['mean_length']:.1f} / {a['max_length']} ({a['at_cap']:.0%}) "
            f"| {'yes' if s['same_tokens'] else 'NO'} "
            f"| {a['seconds']['step']:.3f} ({a['seconds']['sample']:.3f} / "
            f"{a['seconds']['update']:.3f}) | {b['seconds']['step']:.3f} "
            f"({b['seconds']['sample']:.3f} / {b['seconds']['update']:.3f}) "
            f"| {a['sampler_padding']:.0%} / {b['sampler_padding']:.0%} "
            f"| {a['update_padding']:.0%} / {b['update_padding']:.0%} ({b['rows']} of {r['N']}) "
            f"| {a['real_tokens_per_s']:,.0f} / {b['real_tokens_per_s']:,.0f} "
            f"| {s['loss_diff']:.1e}, {s['grad_norm_diff']:.1e} |"
        )
    lines += [
        "",
        "| arm | step s | sample s | score s | update s | sampler padding | update padding "
        "| real tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in ARMS:
        m = r["summary"][arm]
        lines.append(
            f"| {arm} | {m['step_s']:.3f} | {m['sample_s']:.3f} | {m['score_s']:.3f} "
            f"| {m['update_s']:.3f} | {m['sampler_padding']:.0%} | {m['update_padding']:.0%} "
            f"| {m['real_tokens_per_s']:,.0f} |"
        )
    q = r["padded_over_packed"]
    goal = " (issue 45's goal: >= 1.5x)" if r["shape"] == "smollm2" else ""
    timed = sum(s["timed"] for s in r["steps"])
    swapped = [s["step"] for s in r["steps"] if s["padded"]["substituted_advantages"]]
    lines.append(
        f"\npadded / packed: step {q['step']:.2f}x{goal}, sample {q['sample']:.2f}x, update "
        f"{q['update']:.2f}x; medians of {timed} timed steps after {r['warmup']} warm-up. "
        f"CPU: {machine['cpu']}; f32 matmul peak {machine['matmul_peak_tflops']:.3f} "
        f"TFLOP/s; load average {machine['load_start']:.1f} at the start, "
        f"{machine['load_end']:.1f} at the end."
        + (f" Standard normal advantages (all were 0) in steps {swapped}." if swapped else "")
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    machine = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "commit": git_commit(),
        "load_start": os.getloadavg()[0],
        "matmul_peak_tflops": matmul_peak(256 if args.smoke else 2048) / 1e12,
    }
    results = []
    for shape in args.shapes:
        results.append(compare(shape, args))
        machine["load_end"] = os.getloadavg()[0]
        print(table(results[-1], machine) + "\n", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": machine, "shapes": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
