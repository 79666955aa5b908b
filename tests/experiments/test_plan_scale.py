"""experiments.plan_scale's pieces that need no compiler: models, mesh candidates, the
smallest slice, bad input."""

import json
import pathlib

import pytest

from experiments import plan_scale
from experiments.train import load_config
from kjax import scale
from kjax.rl.config import override

PRESET = "experiments/configs/llama31_8b_math.py:passk"


def test_known_models_have_the_published_sizes():
    c8 = plan_scale.model_config(load_config(PRESET), "llama-3.1-8b")
    c70 = plan_scale.model_config(load_config(PRESET), "llama-3.1-70b")
    # Meta's model cards: 8.03B and 70.6B parameters.
    assert scale.param_count(c8) == 8_030_261_248
    assert scale.param_count(c70) == 70_553_706_496


def test_hf_directory_is_read_by_its_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(plan_scale.KNOWN_MODELS["llama-3.1-8b"]))
    c = plan_scale.model_config(load_config(PRESET), str(tmp_path))
    assert c.num_layers == 32 and c.vocab_size == 128256
    with pytest.raises(ValueError, match="no config.json"):
        plan_scale.model_config(load_config(PRESET), str(tmp_path / "missing"))


def test_candidates_split_the_batch_and_the_heads():
    """Tensor divides the 32 query heads and divides, or is a multiple of, the 8 kv heads;
    on v5e-256 (256 chips, 64 prompt groups per minibatch) that leaves tensor 4 to 32."""
    cfg = load_config(PRESET)
    c = plan_scale.model_config(cfg, "llama-3.1-8b")
    for chips in (64, 256):
        found = plan_scale.candidates(cfg, c, chips)
        assert found
        for (data, fsdp, tensor), micro in found:
            assert data * fsdp * tensor == chips and c.num_heads % tensor == 0
            assert c.num_kv_heads % tensor == 0 or tensor % c.num_kv_heads == 0
            assert cfg.batch_prompts % (cfg.rl.minibatches * micro * data * fsdp) == 0
    tensors = {m[2] for m, _ in plan_scale.candidates(cfg, c, 256)}
    assert tensors == {4, 8, 16, 32}


def test_smallest_topology_holds_the_state():
    # 100 GiB of state: a v5p 2x2x1 slice holds 4 x 95 GiB.
    assert plan_scale.smallest_topology("v5p", 100 * 2**30) == "v5p:2x2x1"
    # 200 GiB on v5e (16 GiB a chip): 16 chips (4x4) are the first over it.
    assert plan_scale.smallest_topology("v5e", 200 * 2**30) == "v5e:4x4"
    assert plan_scale.smallest_topology("v5e", 10**13) is None


@pytest.mark.parametrize(
    "args, message",
    [
        (["--topology=v9:2x2"], "unknown chip"),
        (["--topology=v5p:4x4x"], "must look like"),
        (["--topology=v5p:2x2x2", "--mesh=1,2"], "--mesh must be"),
        (["--topology=v5p:2x2x2", "--config.rl.epochs=0"], "rl.epochs"),
    ],
)
def test_bad_input_exits_2_naming_it(args, message, capsys):
    code = plan_scale.main([f"--config={PRESET}", "--model=llama-3.1-8b", *args])
    assert code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message, fixed",
    [
        (["--topology=v5e:3x3"], "--topology=v5e:3x3: v5e comes in 2x2, 2x4", "--topology=v5e:4x4"),
        (["--topology=h100:0"], "--topology=h100:0: h100 comes in 1, 2, 4, 8", "--topology=h100:8"),
        (["--topology=v5p:2x2x2", "--mesh=1,x,2"], "--mesh must be data,fsdp,tensor (three ints",
         "--mesh=1,4,2"),
        (["--topology=v5p:2x2x2", "--mesh=1,2,2"], "--mesh=1,2,2 uses 4 devices but "
         "--topology=v5p:2x2x2 has 8", "--mesh=2,2,2"),
    ],
)  # fmt: skip
def test_arguments_are_checked_before_the_environment(args, message, fixed, capsys, monkeypatch):
    """Each bad flag is named even where the compiler is missing (libtpu, CUDA); the
    corrected flag gets past the checks to the environment's own message."""
    monkeypatch.setattr(scale, "libtpu_missing", lambda t: "libtpu is not installed (stand-in)")
    argv = [f"--config={PRESET}", "--model=llama-3.1-8b"]
    assert plan_scale.main([*argv, *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "libtpu" not in err and "Traceback" not in err
    flag = fixed.partition("=")[0]
    corrected = [fixed if a.startswith(flag + "=") else a for a in args]
    assert plan_scale.main([*argv, *corrected]) == 2
    assert "libtpu is not installed (stand-in)" in capsys.readouterr().err


def test_docs_scale_table_is_the_committed_plans():
    """Every row of docs/scale.md's table comes from a committed --out summary."""
    root = pathlib.Path(__file__).parents[2]
    doc = (root / "docs" / "scale.md").read_text()
    plans = sorted((root / "experiments" / "results" / "plan_scale").glob("*.json"))
    assert plans
    assert plan_scale.TABLE_HEADER in doc
    for path in plans:
        for summary in json.loads(path.read_text()):
            assert summary["label"] == "compiled, not run"
            assert plan_scale.table_row(summary) in doc, path.name


def test_search_orders_meshes_that_can_fit_first():
    """8B MATH on v6e-64 (32 GiB chips): the analytic estimate (kjax.scale.memory_bound,
    held to the compiled summaries by tests/test_scale_memory.py) puts the meshes under
    32 GiB first; the tensor-1 meshes with one microbatch, which the compiler says need
    61-70 GiB, come after. No compile."""
    cfg = load_config(PRESET)
    c = plan_scale.model_config(cfg, "llama-3.1-8b")
    hbm = scale.CHIPS["v6e"].hbm_bytes
    ordered = plan_scale.candidates(cfg, c, 64, hbm)
    assert sorted(ordered) == sorted(plan_scale.candidates(cfg, c, 64))
    shape = scale.Shape.of(cfg)
    bound = [scale.memory_bound(c, shape, m, micro, cfg.rl.minibatches, 2, hbm_bytes=hbm)
             for m, micro in ordered]  # fmt: skip
    fits = [b <= hbm for b in bound]
    assert fits[0] and fits == sorted(fits, reverse=True)  # every fitting mesh first
    assert bound[fits.index(False) :] == sorted(bound[fits.index(False) :])
    assert ordered.index(((1, 64, 1), 1)) >= fits.count(True)


def test_search_on_v5e_256_starts_with_the_mesh_that_fit():
    """8B MATH on v5e-256: with the update's residual stream whole on every tensor device
    (the default; rl.sequence_parallel off),
    1x64x4 x 1 needed 19.48 GiB of temporaries of 15.75 and 1x32x8 x 2 peaked at 15.25 of
    16, and the estimate (stream_split=False) put 1x64x4 x 1 past 16 GiB; with the stream
    split over tensor (kjax.sharding.constrain_residual) 1x64x4 x 1 compiled to 15.20 of
    16 GiB (docs/scale.md), and the estimate puts it first, under 16 GiB."""
    cfg = load_config(PRESET)
    c = plan_scale.model_config(cfg, "llama-3.1-8b")
    hbm = scale.CHIPS["v5e"].hbm_bytes
    assert plan_scale.candidates(cfg, c, 256, hbm)[0] == ((1, 32, 8), 2)  # stream whole
    split = override(cfg, {"rl.sequence_parallel": "true"})
    assert plan_scale.candidates(split, c, 256, hbm)[0] == ((1, 64, 4), 1)
    shape = scale.Shape.of(cfg)
    on = scale.memory_bound(c, shape, (1, 64, 4), 1, 2, 2, hbm_bytes=hbm, stream_split=True)
    assert on < hbm < scale.memory_bound(c, shape, (1, 64, 4), 1, 2, 2, hbm_bytes=hbm)
    whole = scale.update_memory(c, shape, (1, 64, 4), 1, 2, 2, stream_split=False)
    assert whole.total > hbm
