"""A preset's layouts per slice: where the preset's `config.mesh` rule (one per model) is
not the layout that compiled fastest on a chip kind and slice size, the preset file
names the mesh and microbatches for that slice in `SLICE_LAYOUTS`:

    SLICE_LAYOUTS = {"passk": {("v5e", 256): (MeshConfig(data=1, fsdp=32, tensor=8), 2)}}

experiments.plan_scale (for a --topology of that chip and size) and experiments.train
(on devices of that kind and count) use it unless the command line gives a mesh
(--mesh, --config.mesh.*) or microbatches (--microbatches, --config.rl.microbatches).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib

from kjax.rl.config import MeshConfig, TrainConfig

# jax's device_kind of each chip (lower case) -> the chip names of kjax.scale.CHIPS.
_KINDS = (
    ("v5 lite", "v5e"),
    ("v5e", "v5e"),
    ("v6 lite", "v6e"),
    ("v6e", "v6e"),
    ("v5p", "v5p"),
    ("tpu v5", "v5p"),  # v5p reports "TPU v5"
    ("tpu v4", "v4"),
    ("h100", "h100"),
)


def chip_kind(device_kind: str) -> str | None:
    """kjax.scale's chip name ("v5e") of a jax device_kind ("TPU v5 lite"), or None."""
    kind = device_kind.lower()
    for key, chip in _KINDS:
        if key in kind:
            return chip
    return None


def layouts(spec: str) -> dict[tuple[str, int], tuple[MeshConfig, int]]:
    """The SLICE_LAYOUTS of FILE.py:PRESET's preset ({} where the file names none)."""
    path, _, preset = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location(pathlib.Path(path).stem, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    table = getattr(module, "SLICE_LAYOUTS", {})
    return table.get(preset or "", {})


def given(argv: list[str]) -> bool:
    """Whether the command line sets the mesh or the microbatches itself."""
    names = ("--mesh", "--microbatches", "--config.rl.microbatches")
    return any(a.startswith("--config.mesh.") or a.partition("=")[0] in names for a in argv)


def for_slice(cfg: TrainConfig, spec: str, chip: str | None, chips: int,
              argv: list[str]) -> tuple[TrainConfig, tuple[MeshConfig, int] | None]:  # fmt: skip
    """(cfg with the preset's layout for `chips` of `chip` applied, that layout), or (cfg,
    None) where the preset names none, the command line gives its own (argv), or the
    run samples on devices of its own (mesh.sampler_devices)."""
    if chip is None or given(argv) or cfg.mesh.sampler_devices:
        return cfg, None
    found = layouts(spec).get((chip, chips))
    if found is None:
        return cfg, None
    mesh, microbatches = found
    rl = dataclasses.replace(cfg.rl, microbatches=microbatches)
    return dataclasses.replace(cfg, mesh=mesh, rl=rl), found
