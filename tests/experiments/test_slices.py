"""experiments.slices: a preset's mesh and microbatches per slice, as plan_scale and the
trainer pick them when the command line gives none. No compile."""

import types

import jax
import pytest

from experiments import plan_scale, slices, train
from experiments.train import load_config
from kjax import scale
from kjax.rl.config import MeshConfig

PRESET = "experiments/configs/llama31_8b_math.py:passk"


@pytest.mark.parametrize(
    "kind, chip",
    [("TPU v5 lite", "v5e"), ("TPU v6 lite", "v6e"), ("TPU v5", "v5p"), ("TPU v5p", "v5p"),
     ("TPU v4", "v4"), ("NVIDIA H100 80GB HBM3", "h100"), ("cpu", None)],
)  # fmt: skip
def test_chip_kind_of_jax_device_kinds(kind, chip):
    assert slices.chip_kind(kind) == chip


def test_the_8b_preset_names_its_v5e_256_layout_only():
    cfg = load_config(PRESET)
    got, layout = slices.for_slice(cfg, PRESET, "v5e", 256, [])
    assert layout is not None and got.mesh.resolve(256) == (1, 32, 8)
    assert got.rl.microbatches == 2 and got.rl.epochs == cfg.rl.epochs
    # B = 128 prompts split into 2 minibatches x 2 microbatches x data 1 x fsdp 32
    assert got.batch_prompts % (got.rl.minibatches * 2 * got.mesh.batch_devices(256)) == 0
    for chip, chips in (("v6e", 64), ("v5p", 64), ("v5e", 64), (None, 256)):
        assert slices.for_slice(cfg, PRESET, chip, chips, []) == (cfg, None)
    assert slices.for_slice(cfg, "experiments/configs/llama31_8b_math.py:codecontests", "v5e",
                            256, [])[1] is None  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [["--mesh=1,8,32"], ["--mesh", "1,8,32"], ["--microbatches=4"],
     ["--config.mesh.fsdp=16"], ["--config.rl.microbatches=4"]],
)  # fmt: skip
def test_a_mesh_or_microbatches_on_the_command_line_wins(argv):
    cfg = load_config(PRESET)
    assert slices.for_slice(cfg, PRESET, "v5e", 256, argv) == (cfg, None)


def _first_mesh(monkeypatch, *args):
    tried = []

    def plan(cfg, c, topology, sizes, micro, **kw):
        tried.append((tuple(sizes), micro))
        raise ValueError("not compiled in this test")

    monkeypatch.setattr(scale, "libtpu_missing", lambda t: None)
    monkeypatch.setattr(scale, "plan", plan)
    code = plan_scale.main([f"--config={PRESET}", "--model=llama-3.1-8b", *args])
    assert code == 1  # nothing compiled
    return tried[0]


def test_plan_scale_starts_with_the_slice_layout(monkeypatch):
    """v5e-256 without --mesh: the preset's 1x32x8 x 2; with --mesh, that mesh and the
    config's microbatches; v6e-64 (the issue's acceptance command): config.mesh, 1x8x8 x 8."""
    assert _first_mesh(monkeypatch, "--topology=v5e:16x16") == ((1, 32, 8), 2)
    assert _first_mesh(monkeypatch, "--topology=v5e:16x16", "--mesh=1,8,32") == ((1, 8, 32), 8)
    assert _first_mesh(monkeypatch, "--topology=v6e:8x8") == ((1, 8, 8), 8)


def test_the_trainer_applies_it_on_devices_of_that_kind(monkeypatch):
    cfg = load_config(PRESET)
    argv = [f"--config={PRESET}", "--workdir=/tmp/unused"]
    monkeypatch.setattr(jax, "devices", lambda: [types.SimpleNamespace(device_kind="TPU v5 lite")])
    got = train._slice_layout(cfg, argv, 256)
    assert got.mesh == MeshConfig(data=1, fsdp=32, tensor=8) and got.rl.microbatches == 2
    assert train._slice_layout(cfg, [*argv, "--config.mesh.fsdp=16"], 256) == cfg
    monkeypatch.setattr(jax, "devices", lambda: [types.SimpleNamespace(device_kind="cpu")])
    assert train._slice_layout(cfg, argv, 256) == cfg
