"""The RL update padded vs packed (rl.pack OFF vs GROUP, issue 45), on real rollouts.

Used by experiments.bench.bench_rl_step (--pack). For each preset: open its run at
max_new_tokens=T (random init, no SFT warm start: the lengths are what that sampler
writes, stopping at its stop ids or the cap), draw `batches` rollout batches with the
run's own sampler, verifier and advantages (kjax.rl.loop.prepare), then time the run's
jitted update (make_train_step with the preset's StepConfig) on each batch, OFF and GROUP
alternating, each call from a fresh copy of the same state, every bucket compiled before
timing. Reports the completions' padding fraction, the packed rows R of each batch, the
best of `repeats` per batch and mode, and the |loss| and |grad norm| differences (the two
modes compute the same update). An untrained model scores 0 on every problem, so every
advantage would be 0 (and the loss with it): a batch whose advantages are all 0 gets
standard normal ones instead (the update's cost does not depend on their values).
A benchmark, not a test: on a shared CPU figures are noisy.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.configs import tiny_arith, tiny_countdown
from kjax.data import loader
from kjax.rl import loop, packing
from kjax.rl.components import step_and_sampler
from kjax.rl.config import PackMode, SFTConfig
from kjax.rl.train_step import RLBatch

PRESETS = {  # name -> (config module, preset)
    "tiny_arith": (tiny_arith, "passk"),
    "tiny_countdown": (tiny_countdown, "maxk"),
}


def config(shape: str, T: int, smoke: bool = False):
    module, preset = PRESETS[shape]
    cfg = module.get_config(preset)
    cfg = dataclasses.replace(cfg, sft=SFTConfig(steps=0), max_new_tokens=T, name=f"pack_{shape}")
    if smoke:  # fewer prompts and problems: the code paths, quickly
        cfg = dataclasses.replace(
            cfg,
            batch_prompts=8,  # a multiple of the test suite's 8 devices
            samples=4,
            objective=dataclasses.replace(cfg.objective, k=2),
            task=dataclasses.replace(cfg.task, train_size=64, test_size=8),
        )
    return cfg


def compare(shape: str, T: int = 128, batches: int = 2, repeats: int = 3, smoke=False) -> dict:
    """Times of the update on `batches` real rollout batches, padded and packed."""
    cfg = config(shape, T, smoke)
    with tempfile.TemporaryDirectory() as workdir:
        c, state = loop.build_components(cfg, workdir, log=lambda *a: None)
        source = loop.Batches(c.task.train, cfg.batch_prompts, cfg.seed, loader.Position())
        steps = {}
        for mode in (PackMode.OFF, PackMode.GROUP):  # the run's update, as the loop builds it
            rl = dataclasses.replace(cfg.rl, pack=mode)
            steps[mode] = step_and_sampler(
                dataclasses.replace(cfg, rl=rl), c.model_config, c.mesh, state, c.task
            )[0]
        k = np.int32(cfg.k_at(0))
        rows, results = [], []
        for i in range(batches):
            p = loop.prepare(c, state.params, source, i)
            host = dict(p.batch)
            if not np.any(host["advantages"]):
                rng = np.random.default_rng(i)
                host["advantages"] = rng.standard_normal(host["advantages"].shape, np.float32)
            batch = RLBatch(**{n: jax.device_put(a, c.batch_sharding) for n, a in host.items()})
            R = packing.PackedStep.rows_of(batch)
            best = dict.fromkeys(steps, float("inf"))
            losses, norms = {}, {}
            for rep in range(repeats + 1):  # the first round compiles (untimed)
                for mode, step in steps.items():
                    fresh = jax.tree.map(jnp.copy, state)
                    jax.block_until_ready(fresh)
                    t = time.perf_counter()
                    _, metrics = jax.block_until_ready(step(fresh, batch, c.ref_params, k))
                    if rep:
                        best[mode] = min(best[mode], time.perf_counter() - t)
                    losses[mode] = float(metrics["loss"])
                    norms[mode] = float(metrics["grad_norm"])
            mask = np.asarray(p.batch["mask"])
            B, N, _ = mask.shape
            rows.append(R)
            results.append(
                {
                    "padding": 1.0 - mask.sum() / mask.size,
                    "mean_length": float(mask.sum(-1).mean()),
                    "max_length": int(mask.sum(-1).max()),
                    "rows": R,
                    "packed_padding": 1.0 - mask.sum() / (B * R * mask.shape[-1]),
                    "padded_s": best[PackMode.OFF],
                    "packed_s": best[PackMode.GROUP],
                    "speedup": best[PackMode.OFF] / best[PackMode.GROUP],
                    "loss_diff": abs(losses[PackMode.OFF] - losses[PackMode.GROUP]),
                    "loss": losses[PackMode.OFF],
                    "grad_norm_diff": abs(norms[PackMode.OFF] - norms[PackMode.GROUP]),
                    "grad_norm": norms[PackMode.OFF],
                }
            )
        c.close()
    return {
        "shape": shape, "B": cfg.batch_prompts, "N": cfg.samples, "T": T,
        "S": c.task.prompt_len, "loss": cfg.rl.loss.name, "batches": results,
        "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
    }  # fmt: skip


def table(results: list[dict]) -> str:
    lines = [
        "Update padded (rl.pack=OFF) vs packed (GROUP) on real rollout batches, alternating "
        "in this run (best of the repeats per batch):\n",
        "| shape | B x N, S + T | batch | padding | mean / max length | R of N "
        "| padded s | packed s | speedup | loss, |diff| | grad norm, |diff| |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for i, b in enumerate(r["batches"]):
            lines.append(
                f"| {r['shape']} | {r['B']} x {r['N']}, {r['S']} + {r['T']} | {i} "
                f"| {b['padding']:.0%} | {b['mean_length']:.1f} / {b['max_length']} "
                f"| {b['rows']} of {r['N']} | {b['padded_s']:.3f} | {b['packed_s']:.3f} "
                f"| {b['speedup']:.2f}x | {b['loss']:.4g}, {b['loss_diff']:.1e} "
                f"| {b['grad_norm']:.4g}, {b['grad_norm_diff']:.1e} |"
            )
    return "\n".join(lines)
