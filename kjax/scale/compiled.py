"""One program compiled for a topology: what the compiler reports per chip (memory_analysis,
the HLO's FLOPs, HBM bytes and collectives per loop trip, the interconnect bytes per mesh
axis), its largest arrays, and its roofline: compute, HBM and ICI time side by side."""

from __future__ import annotations

import dataclasses
import math
import re
import time

import jax
import numpy as np

from kjax import hlo_stats
from kjax.scale.chips import Chip

UNBOUNDED_HBM_MIB = 1 << 24  # 16 TiB: what a chip would need, when it is more than it has


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What the TPU compiler reports for one program on one chip."""

    name: str
    seconds: float  # lower + compile wall time
    flops: float  # loops counted per trip (kjax.hlo_stats)
    bytes_accessed: float  # HBM traffic, loops counted per trip (kjax.hlo_stats)
    xla_flops: float  # cost_analysis(): every loop body counted once
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    code_bytes: int
    collectives: dict[str, tuple[int, int]]
    unbounded_loops: int
    overflow: str | None = None  # the compiler's out-of-memory message, if it gave one
    # {mesh axes of a replica group ("fsdp", "fsdp+tensor"): (bytes each chip sends over
    # the interconnect, torus dimensions those groups span)}, loops counted per trip
    ici: dict[str, tuple[float, int]] = dataclasses.field(default_factory=dict)
    uncosted_kernels: int = 0  # Pallas kernel calls counted at 0 FLOPs (no cost known)

    @property
    def peak_bytes(self) -> int:
        """Arguments + outputs not aliased to (donated) arguments + temporaries + code."""
        return (
            self.argument_bytes
            + self.output_bytes
            - self.alias_bytes
            + self.temp_bytes
            + self.code_bytes
        )

    def compute_seconds(self, chip: Chip) -> float:
        return self.flops / chip.bf16_flops

    def hbm_seconds(self, chip: Chip) -> float:
        return self.bytes_accessed / chip.hbm_bandwidth

    def ici_seconds(self, chip: Chip) -> float:
        """Each mesh axis's bytes over what one chip can send on the links its groups
        span (Chip.egress); the axes one after another. 0 for a chip with no ICI figure."""
        total = 0.0
        for sent, dims in self.ici.values():
            egress = chip.egress(dims)
            total += sent / egress if egress else 0.0
        return total

    def seconds_on(self, chip: Chip) -> float:
        """Roofline time, perfect overlap: max(compute, HBM, ICI)."""
        return max(self.compute_seconds(chip), self.hbm_seconds(chip), self.ici_seconds(chip))

    def serial_seconds_on(self, chip: Chip) -> float:
        """No overlap: compute + HBM + ICI."""
        return self.compute_seconds(chip) + self.hbm_seconds(chip) + self.ici_seconds(chip)


def mesh_group_key(mesh):
    """(key, dims): key(group of partition ids) -> the mesh axes the group spans ("fsdp",
    "fsdp+tensor"), recording in dims[label] the fewest physical torus dimensions
    (device.coords) any such group spans (1 where devices have no coordinates)."""
    shape, names = mesh.devices.shape, mesh.axis_names
    flat = list(mesh.devices.flat)
    dims: dict[str, int] = {}

    def key(group: tuple[int, ...]) -> str:
        if max(group) >= len(flat):
            return f"{len(group)} chips"
        at = np.array([np.unravel_index(i, shape) for i in group])
        label = "+".join(n for k, n in enumerate(names) if len(set(at[:, k])) > 1) or "self"
        coords = [getattr(flat[i], "coords", None) for i in group]
        spanned = 1
        if all(c is not None for c in coords):
            varying = [len({tuple(c)[d] for c in coords}) > 1 for d in range(len(coords[0]))]
            spanned = max(1, sum(varying))
        dims[label] = min(dims.get(label, spanned), spanned)
        return label

    return key, dims


def largest_buffers(hlo_text: str, k: int = 3) -> list[tuple[int, str, str]]:
    """The k largest distinct arrays a compiled module holds per chip: (bytes, type,
    op_name), read from the results of every instruction outside fusions (a while loop's
    carried tuple by element), so that an out-of-memory answer can name its tensors. Arrays
    of one type are listed once (a K and a V cache of one shape share a line)."""
    comps, _, _ = hlo_stats._parse(hlo_text)
    inside = {
        c
        for instrs in comps.values()
        for i in instrs
        if i.op == "fusion"
        for c in re.findall(r"calls=%([\w.\-]+)", i.attrs)
    }
    found: dict[str, tuple[int, str]] = {}
    for comp, instrs in comps.items():
        if comp in inside:
            continue
        for i in instrs:
            m = re.search(r'op_name="([^"]*)"', i.attrs)
            where = "/".join(m.group(1).split("/")[-3:]) if m else ""
            for dtype, dims in hlo_stats._arrays(i.type):
                key = f"{dtype}[{','.join(map(str, dims))}]"
                size = math.prod(dims) * hlo_stats._BITS[dtype] // 8
                if key not in found or (where and not found[key][1]):
                    found[key] = size, where
    top = sorted(found.items(), key=lambda kv: -kv[1][0])[:k]
    return [(size, key, where) for key, (size, where) in top]


def compile_one(name: str, fn, *args, mesh=None, kernel_cost=None) -> Compiled:
    """Lowers and compiles jitted `fn` for abstract `args`; reads the compiler's analyses.
    `mesh` names the interconnect buckets by mesh axis (else by group size);
    `kernel_cost` costs Pallas kernels (hlo_stats.module_stats).

    A program that does not fit the chip's HBM is compiled again against a pretend HBM of
    UNBOUNDED_HBM_MIB, so that its memory_analysis says by how much (`overflow`)."""
    start = time.perf_counter()
    lowered = fn.lower(*args)
    overflow = None
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        overflow = str(e).strip().splitlines()[0]
        try:
            compiled = lowered.compile({"xla_tpu_no_crash_on_oom": True})
        except jax.errors.JaxRuntimeError as again:  # seen on v5e: "Invalid TPU program."
            raise ValueError(
                f"{name}: {overflow} Compiled again past HBM to measure it, the compiler "
                f"answered: {str(again).strip().splitlines()[0]}"
            ) from again
        overflow += " Largest buffers per chip: " + "; ".join(
            f"{key} {size / (1 << 30):.2f} GiB ({where or 'no op_name'})"
            for size, key, where in largest_buffers(compiled.as_text())
        )
    seconds = time.perf_counter() - start
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, list) else cost) or {}  # None on a GPU target
    mem = compiled.memory_analysis()
    key, dims = mesh_group_key(mesh) if mesh is not None else (None, {})
    stats = hlo_stats.module_stats(compiled.as_text(), group_key=key, kernel_cost=kernel_cost)
    return Compiled(
        name=name,
        seconds=seconds,
        flops=stats.flops,
        bytes_accessed=stats.bytes,
        xla_flops=float(cost.get("flops", 0.0)),
        argument_bytes=mem.argument_size_in_bytes,
        output_bytes=mem.output_size_in_bytes,
        alias_bytes=mem.alias_size_in_bytes,
        temp_bytes=mem.temp_size_in_bytes,
        code_bytes=mem.generated_code_size_in_bytes,
        collectives=stats.collectives,
        unbounded_loops=stats.unbounded_loops,
        overflow=overflow,
        ici={label: (sent, dims.get(label, 1)) for label, sent in stats.ici.items()},
        uncosted_kernels=stats.uncosted_kernels,
    )
