"""Will this RL run fit a TPU pod, on which mesh, and how fast? Asked of the TPU compiler.

  pip install -e '.[tpu]'    # libtpu: compiles for TPU topologies on a CPU-only machine
  python -m experiments.plan_scale --config=experiments/configs/llama31_8b_math.py:passk \\
      --model=llama-3.1-8b --topology=v5p:4x4x4 [--mesh=1,8,8] [--search=3] [--out=plan.json]
  python -m experiments.plan_scale --config=experiments/configs/llama31_8b_math.py:passk \\
      --model=llama-3.1-8b --topology=v6e:4x4 --calibrate   # against MaxText's measurement

Builds kjax's own RL update (the trainer's jitted step: loss, optimizer, PPO epochs and
microbatches as configured) and grouped sampler (prefill, decode steps with the KV cache)
from abstract arrays on a mesh of the topology's devices and compiles them (kjax.scale);
prints per chip the bytes of parameters, optimizer state, gradients, temporaries, KV
cache and the peak against HBM, the FLOPs of an update and a decode step against the
analytic count, the collectives, and a roofline projection of the RL step.
--model: llama-3.1-8b, llama-3.1-70b (their config.json, below), or an HF directory /
config.json (no weights read); default: config.model.path's, or the TINY model.
--mesh: data,fsdp,tensor (default: the preset's layout for the slice, SLICE_LAYOUTS in
experiments/slices.py, else its config.mesh); --search=N compiles up to N
more meshes (data x fsdp x tensor, microbatches), those whose analytic memory bound fits
the chip first, and ranks all by projected step time. --lengths=mean=0.4[,tail=0.05]
(or a histogram, or a run's metrics.jsonl: kjax.scale.lengths.parse) also compiles, per
mesh, the packed update at the rows that distribution needs and the compacting sampler's
decode step at smaller live batches, and prints real tokens/s/chip and MFU on real tokens
beside the static figure (kjax.scale.real); --pack=batch packs that update with rows
counted per batch shard (rl.pack=BATCH, kjax.rl.batch_packing) instead of per group
(GROUP, the default). --calibrate: kjax's plain
pre-training step of the model (kjax.scale.calibration; default mesh: fsdp over every
chip) instead of the RL step. Every figure is compiled, not run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time

from experiments import slices
from experiments.plan_scale_report import (
    COUNT,
    TABLE_HEADER,
    GiB,
    calibration_report,
    report,
    summary,
    table_row,
)
from experiments.plan_scale_search import candidates, check_args, smallest_topology
from experiments.train import load_config
from kjax.rl.config import ModelKind, TrainConfig, override

# Re-exported: the table's row (tests/experiments/test_plan_scale.py checks docs/scale.md
# against it) and the mesh search, as they were before the split.
__all__ = ["TABLE_HEADER", "candidates", "main", "model_config", "smallest_topology", "table_row"]

# config.json of the two Llama 3.1 sizes (huggingface.co/meta-llama/Llama-3.1-8B and
# Llama-3.1-70B, the fields kjax reads); the Instruct models have the same shapes.
_LLAMA31 = {
    "vocab_size": 128256,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "rms_norm_eps": 1e-5,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "num_key_value_heads": 8,
    "head_dim": 128,
}
KNOWN_MODELS = {
    "llama-3.1-8b": _LLAMA31
    | {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
       "num_attention_heads": 32},
    "llama-3.1-70b": _LLAMA31
    | {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
       "num_attention_heads": 64},
}  # fmt: skip


def model_config(cfg: TrainConfig, model: str):
    """The policy's LlamaConfig from --model, config.model.path, or the TINY sizes."""
    from kjax.models.config import LlamaConfig

    if model in KNOWN_MODELS:
        return LlamaConfig.from_hf(KNOWN_MODELS[model])
    path = model or (cfg.model.path if cfg.model.kind is ModelKind.HF_DIR else "")
    if path:
        file = pathlib.Path(path)
        file = file / "config.json" if file.is_dir() else file
        if not file.is_file():
            raise ValueError(
                f"--model: no config.json at {path!r}; give an HF directory, its config.json, "
                f"or one of {sorted(KNOWN_MODELS)}"
            )
        return LlamaConfig.from_hf(json.loads(file.read_text()))
    if cfg.model.kind is not ModelKind.TINY:
        raise ValueError(f"--model is needed for a {cfg.model.kind.name} model")
    from kjax.rl.components import tiny_model_config

    return tiny_model_config(cfg)


def parse(argv: list[str]):
    parser = argparse.ArgumentParser(prog="experiments.plan_scale", description=__doc__)
    parser.add_argument("--config", required=True, help="FILE.py:PRESET")
    parser.add_argument("--model", default="", help=f"{sorted(KNOWN_MODELS)} or an HF dir")
    parser.add_argument("--topology", required=True, help="e.g. v5p:4x4x4 (comma list)")
    parser.add_argument("--mesh", default="", help="data,fsdp,tensor (default: config.mesh)")
    parser.add_argument("--microbatches", type=int, default=0, help="default: config's")
    parser.add_argument("--search", type=int, default=0, help="more meshes to compile")
    parser.add_argument(
        "--no-full-sampler",
        action="store_true",
        help="skip compiling the whole sampler (its peak from its parts)",
    )
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="compile kjax's pre-training step in MaxText's Llama-3.1-8B v6e configuration "
        "for --topology instead, and set its projection beside MaxText's measurement",
    )
    parser.add_argument(
        "--lengths",
        default="",
        help="completion lengths for a real-token projection: mean=F[,tail=F][,top=F]"
        "[,prompt=N], mean_tokens=N, hist=E:W/E:W, or a run's metrics.jsonl",
    )
    parser.add_argument(
        "--pack",
        default="group",
        choices=("group", "batch"),
        help="with --lengths: the packed update's rl.pack (rows per group or per batch shard)",
    )
    parser.add_argument("--out", default="", help="JSON of every plan")
    args, rest = parser.parse_known_args(argv)
    items = {}
    for item in rest:
        if not item.startswith("--config.") or "=" not in item:
            raise ValueError(f"unknown argument {item!r}; overrides look like --config.x.y=value.")
        path, _, value = item[len("--config.") :].partition("=")
        items[path] = value
    return args, override(load_config(args.config), items)


def _calibrate(args, c, topologies, mesh, log) -> int:
    from kjax.scale import calibration

    found, code = [], 0
    for topology in topologies:
        if not topology.startswith("v6e:"):
            log(f"{topology}: the measurement is of v6e; the ratio compares different chips")
        try:
            r = calibration.calibrate(
                c, topology, mesh_sizes=mesh, log=log, kernel_cost=calibration.kernel_cost(c)
            )
        except ValueError as e:  # the compiler could not measure it past HBM
            print(f"{topology}: the calibration step could not be compiled: {e}", flush=True)
            code = 1
            continue
        print(calibration_report(r), flush=True)
        found.append(r)
    if args.out:
        rows = [
            {
                "model": args.model,
                "topology": r.topology,
                "chips": r.chips,
                "mesh": r.mesh,
                "per_device_batch": r.per_device_batch,
                "seq": r.seq,
                "remat": r.remat,
                "step": dataclasses.asdict(r.step),
                "flops_per_token": r.flops_per_token,
                "compute_seconds": r.step.compute_seconds(r.chip),
                "hbm_seconds": r.step.hbm_seconds(r.chip),
                "ici_seconds": r.step.ici_seconds(r.chip),
                "tokens_per_s_per_chip": r.tokens_per_s_per_chip(),
                "serial_tokens_per_s_per_chip": r.tokens_per_s_per_chip(True),
                "mfu": r.mfu(),
                "serial_mfu": r.mfu(True),
                "ratio": r.ratio(),
                "serial_ratio": r.ratio(True),
                "measured": dataclasses.asdict(r.measured),
                "chip": dataclasses.asdict(r.chip),
                "count": COUNT,
                "label": "compiled, not run",
            }
            for r in found
        ]
        pathlib.Path(args.out).write_text(json.dumps(rows, indent=1))
    log("done")
    return code


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[plan_scale {time.perf_counter() - start:6.0f} s] {msg}", flush=True)

    argv = sys.argv[1:] if argv is None else argv
    try:
        args, cfg = parse(argv)
        import jax.numpy as jnp

        from kjax import scale
        from kjax.scale import lengths as scale_lengths

        c = model_config(cfg, args.model)
        for topology in args.topology.split(","):
            scale.chip_of(topology.strip()), scale.topology_chips(topology.strip())
        topologies, mesh = check_args(args.topology, args.mesh)
        if mesh is None:
            for topology in topologies:
                try:
                    cfg.mesh.resolve(scale.topology_chips(topology))
                except ValueError as e:
                    raise ValueError(
                        f"--topology={topology}: {e} Give --mesh=DATA,FSDP,TENSOR for it."
                    ) from None
        lengths = scale_lengths.parse(args.lengths, scale.Shape.of(cfg).T) if args.lengths else None
    except ValueError as e:
        print(f"experiments.plan_scale: error: {e}", file=sys.stderr)
        return 2
    why = [scale.libtpu_missing(t) for t in topologies if scale.libtpu_missing(t)]
    if why:
        print(f"experiments.plan_scale: error: {why[0]}", file=sys.stderr)
        return 2
    log(f"{c.num_layers} layers, d={c.hidden_size}, vocab {c.vocab_size}; "
        f"{scale.matmul_params(c) / 1e9:.2f}B matmul params")  # fmt: skip
    if args.calibrate:
        return _calibrate(args, c, topologies, mesh, log)
    plans, code, reals = [], 0, {}
    for topology in topologies:
        chips = scale.topology_chips(topology)
        micro = args.microbatches or cfg.rl.microbatches
        first = (cfg.mesh.resolve(chips) if mesh is None else mesh), micro
        layout = slices.for_slice(cfg, args.config, topology.partition(":")[0], chips, argv)[1]
        if layout is not None:  # the preset's layout for this slice (experiments/slices.py)
            first = layout[0].resolve(chips), layout[1]
            log(f"{topology}: the preset's layout for it (SLICE_LAYOUTS): {first}")
        ordered = candidates(cfg, c, chips, scale.chip_of(topology).hbm_bytes)
        tried = [first] + [m for m in ordered if m != first][: args.search]
        found = []
        for sizes, m in tried:
            try:
                p = scale.plan(cfg, c, topology, sizes, m, full_sampler=not args.no_full_sampler,
                               log=log)  # fmt: skip
            except ValueError as e:
                log(f"{topology} mesh {sizes} micro {m}: skipped ({e})")
                continue
            found.append(p)
            print(report(p), flush=True)
            if lengths is not None:
                from kjax.rl.step_config import PackMode
                from kjax.scale import real

                try:
                    pack = PackMode(args.pack)
                    reals[id(p)] = real.plan_real(cfg, c, p, lengths, pack=pack, log=log)
                except ValueError as e:
                    log(f"{topology} mesh {sizes} micro {m}: real tokens skipped ({e})")
                    continue
                print(real.report(reals[id(p)]), flush=True)
        fitting = sorted((p for p in found if p.fits), key=lambda p: p.step_seconds)
        if not found:
            code = 1
            print(f"{topology}: no mesh tried could be compiled and measured (above).")
        elif not fitting:
            code = 1
            # params + gradients + Adam's two moments, in the params' dtype
            state = 4 * scale.param_count(c) * jnp.dtype(scale.param_dtype(cfg)).itemsize
            bigger = smallest_topology(topology.partition(":")[0], state)
            # what the least hungry mesh tried needs in all, were it spread evenly
            need = min(p.peak_bytes * p.chips for p in found)
            spread = smallest_topology(topology.partition(":")[0], need)
            print(
                f"{topology}: nothing fits. Smallest slice whose HBM holds params + "
                f"gradients + optimizer state ({state / GiB:.0f} GiB): "
                f"{bigger or 'none listed'} (a lower bound). The mesh tried needs "
                f"{need / GiB:,.0f} GiB in all (peak x chips); spread evenly that is "
                + (f"{spread} or more" if spread else "more than the largest slice listed")
                + " (an estimate: compile it to know)."
            )
        elif len(fitting) > 1:
            print(f"{topology}: meshes that fit, fastest projected RL step first:")
            for p in fitting:
                print(f"  data,fsdp,tensor={p.mesh} microbatches={p.microbatches}: "
                      f"{p.step_seconds:.2f} s, peak {p.peak_bytes / GiB:.1f} GiB")  # fmt: skip
        plans += found
    if args.out:
        model, split = args.model or cfg.model.path, cfg.rl.sequence_parallel
        summaries = [summary(p, args.config, model, split) for p in plans]
        if reals:
            from kjax.scale import real

            for p, s in zip(plans, summaries, strict=True):
                if id(p) in reals:
                    s["real"] = real.summary(reals[id(p)])
        pathlib.Path(args.out).write_text(json.dumps(summaries, indent=1))
    log("done")
    return code


if __name__ == "__main__":
    sys.exit(main())
