"""bench_trl's TRL environment check: a python that lacks a module the run needs is refused
before the slow kjax side, naming the module and the command that makes the env."""

import subprocess
import sys

import pytest

from experiments.bench import bench_trl


@pytest.mark.parametrize("lora", [0, 16])
def test_trl_env_without_its_modules_is_refused_with_the_install_command(lora, monkeypatch):
    tried = []

    def probe(cmd, **kwargs):  # this env has trl, gguf, datasets but no peft
        tried.append(cmd[-1])
        missing = "peft" in cmd[-1]
        return subprocess.CompletedProcess(cmd, int(missing), "", "No module named 'peft'")

    monkeypatch.setattr(bench_trl.subprocess, "run", probe)
    args = bench_trl.parse_args([f"--lora={lora}", f"--trl_python={sys.executable}"])
    if not lora:  # the full update needs no peft
        assert bench_trl.trl_python(args) == sys.executable
    else:
        with pytest.raises(SystemExit, match=r"cannot import trl, gguf, datasets, peft.*peft=="):
            bench_trl.trl_python(args)
    assert tried == ["import trl, gguf, datasets" + (", peft" if lora else "")]
    assert "torch==2.13.0+cpu" in bench_trl._MAKE_ENV
