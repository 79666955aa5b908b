"""Benchmark: the whole RL step padded vs packed + compacting (issue 45), alternating in one run.

  python -m experiments.bench.bench_padding [--shapes=smollm2,tiny_countdown] [--steps=3]
      [--warmup=1] [--compact_floor=8] [--pack=group,batch] [--out=F.json] [--smoke]

Arms of kjax.rl.loop.rl_step (sample, verify, advantages, update), built from one run:
"padded" is today's default (rl.pack OFF, sampler_compact_floor 0); each --pack mode adds
one packed arm with the compacting sampler (sampler_compact_floor = --compact_floor,
kjax.sampling.compact_sizes): "packed" is rl.pack GROUP (kjax.rl.packing: one row count per
group, the fullest group's), "packed_batch" rl.pack BATCH (kjax.rl.batch_packing: rows
counted over each batch shard's groups). Every step every arm starts from the same train
state (the padded arm's trajectory; the packed arms' new states are dropped), draws the
same prompts and uses the same sampling key, padded first, then the packed arms in --pack
order; so every step is a paired comparison on the same parameters, and the compacting
sampler, token-identical to the static one for the same key, should give every arm the
same tokens (reported per step and arm: `same tokens`).
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
and of the update's positions (1 - real / (rows x T), rows the update runs over the batch:
B N padded, B R packed with R per group, M P R with R per shard of P in each of M
microbatches for packed_batch), real completion tokens per second of the whole step; per
arm the medians of the step and its sample / score (verify + advantages) / update split,
and the padded / packed ratio of each packed arm (the issue's goal for smollm2: >= 1.5x).
With the machine: its float32 matmul peak (experiments.lab.provenance.matmul_peak), CPU
model and load average.
--compact_floor 8 by default, reasoned, not measured: on CPU a SmolLM2 decode step of
fewer rows than that is mostly reading the weights (0.54 GB of float32 a step), so halving
below 8 rows saves little, while each further size adds one more copy of the decode loops
to compile. 0: the packed arm packs the update only and samples with the static sampler.
--smoke (seconds; the default test tier runs it with --compact_floor 0 --pack batch, the
slow tier with --pack group,batch): tiny_arith at 8 x 4 x 16, one warm-up and one timed
step. smollm2 needs ~8.5 GB of RAM (two train states at a step), ~1.6 GB more with both
packed arms (a third state, params and Adam moments in float32, while the first packed arm
steps). Figures: docs/performance.md. A benchmark, not a test: on a shared CPU the figures
are noisy.
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
from kjax.rl import batch_packing, loop, packing
from kjax.rl.components import step_and_sampler
from kjax.rl.config import PackMode, TrainConfig

ARMS = ("padded", "packed")  # the default --pack=group
PACKS = {"group": ("packed", PackMode.GROUP), "batch": ("packed_batch", PackMode.BATCH)}
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
    p.add_argument(
        "--pack", default="group", help="packed arms, comma-separated: group and/or batch"
    )
    p.add_argument("--out", default="", help="also write the results as JSON here")
    p.add_argument("--smoke", action="store_true", help="tiny_countdown, 8 x 4 x 16, 1 step")
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.pack = [s for s in args.pack.split(",") if s]
    if (
        not args.pack
        or any(m not in PACKS for m in args.pack)
        or len(set(args.pack)) < len(args.pack)
    ):
        p.error(f"--pack: one or more of {', '.join(PACKS)}, each once; got {args.pack}.")
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
        # bench_trl's own parser, so a flag it gains later keeps its default here
        trl_args = bench_trl.parse_args(
            ["--prompts=4", "--samples=8", f"--tokens={args.tokens}", f"--steps={args.steps}",
             f"--warmup={args.warmup}"]
        )  # fmt: skip
        cfg = bench_trl.config(trl_args)
    else:
        cfg = pack_update.config(shape, args.tokens, args.smoke)
    optimizer = dataclasses.replace(
        cfg.optimizer, total_steps=max(steps, cfg.optimizer.total_steps)
    )
    return dataclasses.replace(cfg, name=f"bench_padding_{shape}", steps=steps,
                               optimizer=optimizer)  # fmt: skip


def packed_config(cfg: TrainConfig, floor: int, mode=PackMode.GROUP) -> TrainConfig:
    return dataclasses.replace(
        cfg, rl=dataclasses.replace(cfg.rl, pack=mode), sampler_compact_floor=floor
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

        chunks = cfg.rl.minibatches * cfg.rl.microbatches

        def step(state, batch, ref_params, k):
            if isinstance(step_fn, batch_packing.BatchPackedStep):  # R per shard, per micro
                rows, total = step_fn.rows_of(batch), step_fn.total(batch)
                jitted, extra = step_fn.jitted, (rows,)
                micro = B // chunks
                row_total = chunks * batch_packing.layout_shards(micro, shards) * rows
            elif isinstance(step_fn, packing.PackedStep):  # R per group
                rows, total = step_fn.rows_of(batch), N
                jitted, extra, row_total = step_fn.jitted, (rows,), B * rows
            else:
                rows, total, jitted, extra, row_total = N, N, step_fn, (), B * N
            self.record.update(rows=rows, rows_of=total, row_total=row_total, compile_s=0.0)
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
        T = cfg.max_new_tokens
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
            "rows_of": r["rows_of"],
            "real_tokens": real,
            "real_tokens_per_s": real / seconds["step"],
            "update_padding": 1.0 - real / (r["row_total"] * T),
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
        arms = {"padded": _Arm(c, cfg, shards)}
        for mode in args.pack:
            name, pack = PACKS[mode]
            pcfg = packed_config(cfg, args.compact_floor, pack)
            step_fn, sampler = step_and_sampler(pcfg, c.model_config, c.mesh, state, c.task)
            arms[name] = _Arm(dataclasses.replace(c, step_fn=step_fn, sampler=sampler), pcfg,
                              shards)  # fmt: skip
        packed = list(arms)[1:]
        steps = []
        for i in range(cfg.steps):
            state, record = _paired_step(arms, packed, state, i, args.warmup)
            steps.append(record)
        c.close()
        S = c.task.prompt_len
    timed = [s for s in steps if s["timed"]]
    summary = {arm: _summary([s[arm] for s in timed]) for arm in arms}
    ratios = {arm: {n: summary["padded"][f"{n}_s"] / summary[arm][f"{n}_s"]
                    for n in ("step", "sample", "update")} for arm in packed}  # fmt: skip
    B, N = cfg.batch_prompts, cfg.samples
    chunks = cfg.rl.minibatches * cfg.rl.microbatches
    per_shard = B // chunks // batch_packing.layout_shards(B // chunks, shards) * N
    return {
        "shape": shape, "B": B, "N": N, "T": cfg.max_new_tokens,
        "S": S, "compact_floor": args.compact_floor, "arms": list(arms),
        "compact_sizes": list(arms[packed[0]].sizes),
        "buckets": list(packing.buckets(N)),
        "batch_buckets": list(batch_packing.buckets(per_shard)), "warmup": args.warmup,
        "steps": steps, "summary": summary, "padded_over": ratios,
        "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
    }  # fmt: skip


def _paired_step(arms: dict, packed: list[str], state, i: int, warmup: int) -> dict:
    """Step i of every arm from `state` (donated to the last arm; the others get copies):
    (the padded arm's new state, which goes on; the step's record)."""
    copy = jax.block_until_ready(jax.tree.map(jnp.copy, state))
    new, padded = arms["padded"].step(copy, i)
    tokens = padded.pop("tokens")
    record = {"step": i + 1, "timed": i >= warmup, "padded": padded}
    for j, name in enumerate(packed):
        last = j == len(packed) - 1
        start = state if last else jax.block_until_ready(jax.tree.map(jnp.copy, state))
        dropped, out = arms[name].step(start, i)  # its input is donated
        del dropped  # only the padded arm's new state goes on
        out["same_tokens"] = bool(np.array_equal(tokens, out.pop("tokens")))
        out["loss_diff"] = abs(padded["loss"] - out["loss"])
        out["grad_norm_diff"] = abs(padded["grad_norm"] - out["grad_norm"])
        record[name] = out
    for key, agg in (("same_tokens", all), ("loss_diff", max), ("grad_norm_diff", max)):
        record[key] = agg(record[name][key] for name in packed)
    times = ", ".join(f"{a} {record[a]['seconds']['step']:.2f} s" for a in ["padded", *packed])
    print(f"step {i + 1}: {times}, same tokens {record['same_tokens']}", flush=True)
    return new, record


def _summary(rows: list[dict]) -> dict:
    """Medians over the timed steps of an arm (padding fractions: means)."""
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    out = {f"{n}_s": med([r["seconds"][n] for r in rows]) for n in rows[0]["seconds"]}
    out["real_tokens_per_s"] = med([r["real_tokens_per_s"] for r in rows])
    for n in ("update_padding", "sampler_padding"):
        out[n] = float(np.mean([r[n] for r in rows]))
    return out


def table(result: dict, machine: dict) -> str:
    """Per-step and per-arm Markdown tables of one shape: a step row per packed arm."""
    r = result
    packed = r["arms"][1:]
    lines = [
        f"{r['shape']}: B x N x T = {r['B']} x {r['N']} x {r['T']} (S = {r['S']}), compact "
        f"sizes {r['compact_sizes']}, packed rows from {r['buckets']} per group (packed), "
        f"{r['batch_buckets']} per shard (packed_batch); {r['devices']}\n",
        "| step | arm | mean / max length (at cap) | same tokens | padded s (sample / update) "
        "| packed s (sample / update) | sampler padding padded / packed "
        "| update padding padded / packed (R of) | real tok/s padded / packed "
        "| loss, grad norm: |diff| |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in r["steps"]:
        a = s["padded"]
        step = f"{s['step']}" + ("" if s["timed"] else " (warm-up)")
        for arm in packed:
            b = s[arm]
            lines.append(
                f"| {step} | {arm} | {a['mean_length']:.1f} / {a['max_length']} "
                f"({a['at_cap']:.0%}) | {'yes' if b['same_tokens'] else 'NO'} "
                f"| {a['seconds']['step']:.3f} ({a['seconds']['sample']:.3f} / "
                f"{a['seconds']['update']:.3f}) | {b['seconds']['step']:.3f} "
                f"({b['seconds']['sample']:.3f} / {b['seconds']['update']:.3f}) "
                f"| {a['sampler_padding']:.0%} / {b['sampler_padding']:.0%} "
                f"| {a['update_padding']:.0%} / {b['update_padding']:.0%} "
                f"({b['rows']} of {b['rows_of']}) "
                f"| {a['real_tokens_per_s']:,.0f} / {b['real_tokens_per_s']:,.0f} "
                f"| {b['loss_diff']:.1e}, {b['grad_norm_diff']:.1e} |"
            )
    lines += [
        "",
        "| arm | step s | sample s | score s | update s | sampler padding | update padding "
        "| real tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in r["arms"]:
        m = r["summary"][arm]
        lines.append(
            f"| {arm} | {m['step_s']:.3f} | {m['sample_s']:.3f} | {m['score_s']:.3f} "
            f"| {m['update_s']:.3f} | {m['sampler_padding']:.0%} | {m['update_padding']:.0%} "
            f"| {m['real_tokens_per_s']:,.0f} |"
        )
    goal = " (issue 45's goal: >= 1.5x)" if r["shape"] == "smollm2" else ""
    timed = sum(s["timed"] for s in r["steps"])
    swapped = [s["step"] for s in r["steps"] if s["padded"]["substituted_advantages"]]
    ratios = "; ".join(
        f"padded / {arm}: step {q['step']:.2f}x{goal}, sample {q['sample']:.2f}x, update "
        f"{q['update']:.2f}x"
        for arm, q in r["padded_over"].items()
    )
    lines.append(
        f"\n{ratios}; medians of {timed} timed steps after {r['warmup']} warm-up. "
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
