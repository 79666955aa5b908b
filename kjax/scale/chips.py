"""TPU (and H100) chips: their public specs, and the compile-only devices of a topology
(jax.experimental.topologies; libtpu or the CUDA plugin, no accelerator needed)."""

from __future__ import annotations

import dataclasses
import math
import os
import re

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    """One chip's public specs (per chip, dense bf16). `ici_bandwidth`: bidirectional
    inter-chip interconnect bandwidth per chip (in + out, all links), spread over
    `ici_dims` torus dimensions (a GPU's NVLink: one switch, 1); None where the source
    gives no per-chip figure (then no interconnect time is projected)."""

    name: str
    hbm_bytes: int
    bf16_flops: float  # peak FLOP/s
    hbm_bandwidth: float  # bytes/s
    source: str
    ici_bandwidth: float | None = None  # bytes/s, bidirectional, per chip
    ici_dims: int = 1

    def egress(self, dims: int) -> float | None:
        """Bytes/s one chip can send over the links of `dims` of its torus dimensions:
        half the bidirectional figure (out, not in), its share of the dimensions."""
        if self.ici_bandwidth is None:
            return None
        return self.ici_bandwidth / 2 * min(dims, self.ici_dims) / self.ici_dims


CHIPS = {
    # v4's page gives no per-chip ICI figure (only per-Pod all-reduce and bisection).
    "v4": Chip("TPU v4", 32 * GiB, 275e12, 1228e9, "cloud.google.com/tpu/docs/v4", None, 3),
    "v5e": Chip("TPU v5e", 16 * GiB, 197e12, 819e9, "cloud.google.com/tpu/docs/v5e", 400e9, 2),
    "v5p": Chip("TPU v5p", 95 * GiB, 459e12, 2765e9, "cloud.google.com/tpu/docs/v5p", 1200e9, 3),
    "v6e": Chip("TPU v6e", 32 * GiB, 918e12, 1640e9, "cloud.google.com/tpu/docs/v6e", 800e9, 2),
    # GPUs compile through the CUDA plugin (jax-cuda12-plugin) from _H100_TARGET, no GPU.
    # NVLink 4: 900 GB/s per GPU (datasheet), every GPU of a host on one NVSwitch.
    "h100": Chip(
        "NVIDIA H100 SXM", 84929347584, 989e12, 3350e9, "nvidia.com H100 datasheet", 900e9, 1
    ),
}
# XLA's GpuTargetConfigProto of an H100 SXM (xla/tools/hlo_opt/gpu_specs, as in
# github.com/jax-ml/jax/issues/28376), for compiling without one.
_H100_TARGET = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: 3352320000000 l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: 84929347584 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 } registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 7 }
runtime_version { major: 12 minor: 8 patch: 0 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""


def chip_of(topology: str) -> Chip:
    """The Chip of a topology name such as "v5p:4x4x4"."""
    kind = topology.partition(":")[0]
    if kind not in CHIPS:
        raise ValueError(f"topology {topology!r}: unknown chip {kind!r}; known: {sorted(CHIPS)}")
    return CHIPS[kind]


def topology_chips(topology: str) -> int:
    """Chips of a topology name: "v5p:4x4x4" -> 64."""
    dims = topology.partition(":")[2]
    if not re.fullmatch(r"\d+(x\d+)*", dims):
        raise ValueError(f"topology {topology!r} must look like v5p:4x4x4 or v5e:16x16")
    return math.prod(int(d) for d in dims.split("x"))


def libtpu_missing(topology: str = "v5e") -> str | None:
    """Why `topology` cannot be compiled for here (None when its compiler is importable:
    libtpu for a TPU, the CUDA plugin for an h100)."""
    import importlib.util

    if topology.partition(":")[0] == "h100":
        if importlib.util.find_spec("jax_cuda12_plugin") is None:
            return "the CUDA plugin is not installed (pip install jax-cuda12-plugin)"
        return None
    if importlib.util.find_spec("libtpu") is None:
        return "libtpu is not installed (pip install -e '.[tpu]')"
    return None


def topology_devices(topology: str):
    """The compile-only devices of a TPU topology ("v5p:4x4x4" -> 64 TPU v5 devices) or of
    n H100s ("h100:8")."""
    from jax.experimental import topologies

    chip_of(topology)
    why = libtpu_missing(topology)
    if why:
        raise RuntimeError(f"cannot compile for {topology}: {why}")
    if topology.startswith("h100:"):
        n = topology_chips(topology)
        desc = topologies.get_topology_desc(
            platform="cuda", target_config=_H100_TARGET, topology=f"1x1x{n}"
        )
        return desc.devices
    # Outside a TPU VM libtpu asks the metadata server for these; say them instead. With
    # no TPU to guard, several processes may compile at once (libtpu's lockfile is for
    # processes sharing a real chip).
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    return topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
