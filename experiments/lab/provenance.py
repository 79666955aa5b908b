"""Where a result was computed: package versions, CPU, JAX devices and git commit.

Every row a table writes records provenance() of the process that ran it, and each
table file that of its writer, so a number can be traced to the environment that
produced it (table verdicts moved between environments before the install was pinned).
"""

from __future__ import annotations

import os
import pathlib
import platform
import subprocess


def git_commit(repo: pathlib.Path = pathlib.Path(__file__).parent) -> str:
    """HEAD of the git checkout holding `repo`, "-dirty" if tracked files differ from it;
    "unknown" without git or outside a checkout."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=repo, capture_output=True, text=True, timeout=30, check=True
        )
        return done.stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        changes = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if changes else "")


def code_digest(root: pathlib.Path | None = None, versions: bool = True) -> str:
    """sha256 of the source that draws a result: every .py file under root's kjax/ and
    experiments/ (paths and bytes; root: this checkout) and, with versions, jax's, jaxlib's
    and numpy's versions. It moves with any edit, committed or not, and needs no git (the
    commit alone does not: a dirty tree or an install without git reads the same)."""
    import hashlib
    import importlib.metadata

    root = root or pathlib.Path(__file__).resolve().parent.parent.parent
    packages = ("kjax", "experiments")
    h = hashlib.sha256()
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    if versions:
        for name in ("jax", "jaxlib", "numpy"):
            try:
                h.update(f"{name}=={importlib.metadata.version(name)}\0".encode())
            except importlib.metadata.PackageNotFoundError:
                h.update(f"{name} missing\0".encode())
    return h.hexdigest()


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else platform.processor())."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# Instruction sets that change the code XLA emits for the CPU, and so its rounding: two runs
# bit-identical on one CPU model differ in the last bits on another (docs/results.md, Reruns).
CPU_FEATURES = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "asimd", "sve")


def cpu_features(cpuinfo: str | None = None) -> list[str]:
    """The CPU_FEATURES of this CPU (the first "flags" or "Features" line of /proc/cpuinfo,
    or the text given); [] where there is none to read."""
    if cpuinfo is None:
        try:
            cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            have = set(value.split())
            return [f for f in CPU_FEATURES if f in have]
    return []


def matmul_peak(n: int = 2048, repeats: int = 5) -> float:
    """The float32 FLOP/s of an n x n matmul under XLA here, best of `repeats` after a
    compile: the attainable peak that figures from two machines are read against."""
    import time

    import jax
    import jax.numpy as jnp

    a = jnp.ones((n, n), jnp.float32)
    mm = jax.jit(lambda a: a @ a)
    mm(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        mm(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def provenance() -> dict:
    """Where a result was computed: package versions, CPU (model and instruction sets),
    cores, JAX devices, git commit."""
    import importlib.metadata

    import jax

    def version(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    versions = {p: version(p) for p in ("jax", "jaxlib", "flax", "optax", "numpy")}
    return {
        "versions": {**versions, "python": platform.python_version()},
        "cpu": cpu_model(),
        "cpu_features": cpu_features(),
        "cores": os.cpu_count(),
        "backend": jax.default_backend(),
        "devices": [d.device_kind for d in jax.devices()],
        "commit": git_commit(),
    }


def provenance_line(p: dict) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in p["versions"].items())
    devices = sorted(set(p["devices"]))
    return (
        f"Written at commit {p['commit']} with {versions}; {p['cpu']} ({p['cores']} cores); "
        f"JAX backend {p['backend']}, {len(p['devices'])} device(s) ({', '.join(devices)}). "
        "Each JSONL row records the provenance of its run."
    )
