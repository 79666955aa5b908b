"""Every experiments/bench_* module's --smoke run, in this process: an API change that
breaks a benchmark fails here, not months later on the machine that reruns it. The checks
are on each report's structure and on what must agree inside it, never on a timing."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from experiments.bench import (
    bench_model,
    bench_objectives,
    bench_padding,
    bench_rl_step,
    bench_sampler,
    bench_trl,
    bench_verifiers,
    profile_model,
)


def _table(text: str, header_start: str) -> list[list[str]]:
    """The cells of the Markdown table whose header row starts with header_start."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _positive(x) -> bool:
    return isinstance(x, float | int) and math.isfinite(x) and x > 0


def test_bench_objectives_smoke_times_every_objective_next_to_its_oracle(tmp_path, capsys):
    out = tmp_path / "objectives.json"
    assert bench_objectives.main(["--smoke", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert (result["batch"], result["group"], result["k"]) == (8, 10, 4)
    expected = [n for n in bench_objectives.cases(4) if bench_objectives.min_group(n, 4) <= 10]
    assert [r["name"] for r in result["rows"]] == expected
    for r in result["rows"]:
        assert all(_positive(r[key]) for key in r if key != "name"), r
    printed = _table(capsys.readouterr().out, "| function |")
    assert [row[0] for row in printed] == expected


def test_bench_verifiers_smoke_scores_math_and_says_why_code_is_skipped(tmp_path, capsys):
    out = tmp_path / "verifiers.json"
    assert bench_verifiers.main(["--smoke", "--workers", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    math_row = result["rows"][0]
    assert math_row["verifier"] == "math (math-verify)" and math_row["completions"] == 40
    assert 0 < math_row["mean_score"] < 1  # the batch mixes right and wrong answer forms
    has_code_row = len(result["rows"]) == 2
    assert has_code_row == (result["code_skipped"] is None)
    assert has_code_row == (shutil.which("bwrap") is not None)
    text = capsys.readouterr().out
    assert len(_table(text, "| verifier |")) == len(result["rows"])
    assert ("code row skipped: " in text) != has_code_row


def test_bench_model_smoke_reports_both_implementations_against_the_peak(capsys):
    bench_model.main(["--smoke", "--lora", "2"])
    text = capsys.readouterr().out
    assert text.startswith("smoke model (2 layers, family llama), [B,S]=[2,16], float32")
    assert "float32 matmul peak" in text and "LoRA r2 update / full update" in text
    rows = _table(text, "| implementation |")
    names = ["kjax (JAX)", "transformers (PyTorch)", "kjax LoRA r2, base frozen (JAX)"]
    assert [r[0] for r in rows] == names
    for r in rows:
        assert float(r[1]) > 0 and float(r[3]) > 0, r  # fwd and fwd+bwd tok/s
        assert r[2].endswith("%)") and r[4].endswith("%)"), r  # GFLOP/s (MFU)


def test_profile_model_smoke_splits_both_steps_into_ops_that_add_up(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert profile_model.main(["--smoke", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["config"] == {"layers": 2, "vocab": 128, "hidden": 32, "batch": 2, "seq": 16}
    assert _positive(result["peak_gflops"])
    kjax, torch = result["kjax"], result["torch"]
    classes = {c["class"] for c in kjax["classes"]}
    assert {"dot (YNNPACK)", "dot (XLA fallback)"} <= classes, classes
    for side in (kjax, torch):
        assert _positive(side["traced_s"]) and _positive(side["untraced_s"])
        for key in ("ms", "gflop"):  # the classes partition the ops
            total = sum(r[key] for r in side["ops"])
            assert math.isclose(sum(c[key] for c in side["classes"]), total, rel_tol=1e-9)
    # Every dot's FLOPs come from its HLO shapes; the layer scan's ops run once per layer.
    dots = [r for r in kjax["ops"] if r["class"].startswith("dot")]
    assert all(r["gflop"] > 0 and "x" in r["shapes"] for r in dots)
    assert {r["count"] for r in dots} == {1, 2}
    # The step's matmuls: 3x the forward's (bench_model's count), once as kjax's HLO has them.
    c = profile_model.SMOKE
    flops = 3 * 2 * 16 * bench_model.model_flops_per_token(c, 16)
    assert math.isclose(sum(r["gflop"] for r in dots) * 1e9, flops, rel_tol=0.05)
    assert any(r["gflop"] > 0 for r in torch["ops"])  # torch's profiler counted its matmuls
    text = capsys.readouterr().out
    assert text.startswith(result["header"]) and "float32 matmul peak" in text
    assert [r[0] for r in _table(text, "| class |")] == [c["class"] for c in kjax["classes"]]
    assert len(_table(text, "| kjax op |")) == min(15, len(kjax["ops"]))
    assert len(_table(text, "| torch op |")) == min(15, len(torch["ops"]))


def test_bench_sampler_smoke_times_kjax_and_transformers_and_skips_tunix(tmp_path, capsys):
    out = tmp_path / "sampler.json"
    assert bench_sampler.main(["--smoke", "--tunix_python=", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["model"] == "smoke"
    assert _positive(result["peak_gflops_measured"]) and _positive(result["bandwidth_gbs"])
    (row,) = result["rows"]
    assert (row["B"], row["N"], row["S"], row["T"]) == (2, 2, 8, 4)
    assert _positive(row["kjax_tok_s"]) and _positive(row["transformers_tok_s"])
    assert math.isnan(row["tunix_tok_s"])
    assert set(result["prefill_s"]) == {"1", "16"}
    text = capsys.readouterr().out
    assert "Tunix side skipped: no --tunix_python" in text
    assert len(_table(text, "| B x N |")) == 1


def test_bench_sampler_compaction_mode_smoke(tmp_path, capsys):
    out = tmp_path / "compaction.json"
    assert bench_sampler.main(["--smoke", "--compact_floor=1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert result["mode"] == "compaction" and row["sizes"] == [4, 2, 1]
    assert row["same_tokens"] and _positive(row["static_s"]) and _positive(row["compacting_s"])
    assert 0 <= row["padding_compacting"] <= row["padding_static"] < 1
    assert len(_table(capsys.readouterr().out, "| B x N |")) == 1


@pytest.mark.parametrize(
    # The padded-vs-packed comparison (~15 s) is slow-tier: packed equals padded (loss and
    # gradients) is the default tier's tests/rl/test_packing.py and test_batch_packing.py.
    "pack",
    [["--pack="], pytest.param([], marks=pytest.mark.slow)],
    ids=["no_pack", "pack"],
)
def test_bench_rl_step_smoke_splits_the_step_and_both_update_paths_agree(tmp_path, capsys, pack):
    out = tmp_path / "rl_step.json"
    assert bench_rl_step.main(["--smoke", "--out", str(out), *pack]) == 0
    result = json.loads(out.read_text())
    (step,) = result["steps"]
    assert step["shape"] == "tiny_arith"
    assert set(step["seconds"]) == {"sample", "verify", "advantages", "update", "step"}
    assert _positive(step["update_tflops"]) and 0 < step["mfu"]
    (paths,) = result["update_paths"]
    # The shared-prompt path computes the reference path's loss: one loss, two layouts.
    assert paths["loss_diff"] <= 1e-5 * max(1.0, abs(paths["reference"]["loss"]))
    assert paths["reference"]["flops"] > paths["shared"]["flops"]
    assert _positive(paths["speedup"])
    text = capsys.readouterr().out
    assert len(_table(text, "| shape | params |")) == 1
    if pack:
        assert result["pack"] == [] and "| shape | B x N, S + T | batch |" not in text
        return
    assert len(_table(text, "| shape | B x N, S + T | batch |")) == 1
    (packed,) = result["pack"]
    (b,) = packed["batches"]
    # Padded and packed run the same update: the same loss and gradient norm.
    assert 1 <= b["rows"] <= packed["N"] and 0 <= b["padding"] < 1
    assert b["loss_diff"] <= 1e-5 * max(1.0, abs(b["loss"])) and abs(b["loss"]) > 0
    assert b["grad_norm_diff"] <= 1e-4 * b["grad_norm"] and b["grad_norm"] > 0
    assert _positive(b["padded_s"]) and _positive(b["packed_s"])


@pytest.mark.parametrize(
    # --lora's smoke is slow-tier: LoRA's update, sampler and resume have default-tier tests
    # (tests/models/test_lora.py, tests/rl/test_lora_update.py, tests/rl/test_resume.py).
    "lora",
    [[], pytest.param(["--lora", "2"], marks=pytest.mark.slow)],
    ids=["full", "lora"],
)
def test_bench_trl_smoke_runs_kjax_side_and_records_the_prompts_for_trl(tmp_path, capsys, lora):
    out = tmp_path / "trl.json"
    assert bench_trl.main(["--smoke", "--out", str(out), *lora]) == 0
    result = json.loads(out.read_text())
    kjax, smoke = result["kjax"], bench_trl.SMOKE
    assert result["trl"] is None and result["trl_over_kjax"] is None
    config = kjax["config"]
    assert config["lora_rank"] == (2 if lora else 0)
    assert (config["B"], config["N"], config["T"]) == (
        smoke["prompts"],
        smoke["samples"],
        smoke["tokens"],
    )
    assert len(kjax["steps_s"]) == smoke["steps"] and len(kjax["warmup_s"]) == smoke["warmup"]
    for name in ("sample_s", "score_s", "update_s", "completion_mean_length"):
        assert len(kjax[name]) == smoke["steps"], name
    # Every step's prompts, in training order, for TRL's side to train on.
    rows = result["prompts"]
    assert len(rows) == smoke["prompts"] * (smoke["steps"] + smoke["warmup"])
    for row in rows:
        assert row["prompt"][0]["role"] == "user" and "\\boxed{}" in row["prompt"][0]["content"]
        assert 0 < len(row["prompt_ids"]) <= config["S"]
    m = bench_trl.config(bench_trl.parse_args(["--smoke", *lora])).model
    if lora:  # rank 2 on every projection: L x sum of (in + out) x r, what TRL's PEFT counts
        D, E, F = m.hidden_size, m.hidden_size // m.num_heads, m.intermediate_size
        ins_outs = [(D, D), (D, m.num_kv_heads * E), (D, m.num_kv_heads * E), (D, D),
                    (D, F), (D, F), (F, D)]  # fmt: skip
        assert config["trainable_params"] == m.num_layers * 2 * sum(a + b for a, b in ins_outs)
    else:  # the whole model
        assert config["trainable_params"] > 100 * m.num_layers * m.hidden_size
    text = capsys.readouterr().out
    assert "TRL side skipped" in text
    assert [r[0] for r in _table(text, "| side |")] == ["kjax"]
    packed = bench_trl.config(bench_trl.parse_args(["--smoke", "--packed", *lora]))
    assert packed.rl.pack.name == "GROUP" and packed.sampler_compact_floor == 8
    batch = bench_trl.config(bench_trl.parse_args(["--smoke", "--packed=batch", *lora]))
    assert batch.rl.pack.name == "BATCH" and batch.sampler_compact_floor == 8
    assert not config["packed"]  # the default: today's padded step


@pytest.mark.parametrize(
    "module", [bench_objectives, bench_padding, bench_rl_step, bench_sampler, bench_trl]
)
def test_every_benchmark_parses_its_own_arguments(module):
    # The modules are imported together above: none may define process-global flags that
    # collide with another's (absl's did: --shapes, --steps, --out).
    assert module.parse_args(["--smoke"]).smoke


@pytest.mark.slow  # ~18 s on 2 cores: the default tier's 15-minute budget
def test_seed_axis_grad_smoke_runs_and_its_three_gradients_agree(capsys):
    from experiments.bench import seed_axis_grad

    result = seed_axis_grad.main(["--smoke", "--seeds", "2"])
    assert all(_positive(result[k]) for k in ("one_ms", "vmapped_ms", "stacked_ms")), result
    assert result["disagreement"] < 1e-4  # vmapped = one per seed; stacked = 2 x one
    out = capsys.readouterr().out
    assert "2 batches vmapped over 2 parameter sets" in out and "agree to" in out


def _padding_smoke(tmp_path, *flags) -> dict:
    out = tmp_path / "padding.json"
    assert bench_padding.main(["--smoke", "--out", str(out), *flags]) == 0
    result = json.loads(out.read_text())
    assert _positive(result["machine"]["matmul_peak_tflops"])
    (shape,) = result["shapes"]
    warm, timed = shape["steps"]
    assert not warm["timed"] and timed["timed"]
    buckets = {"packed": shape["buckets"], "packed_batch": shape["batch_buckets"]}
    for step in shape["steps"]:
        padded = step["padded"]
        assert padded["rows"] == shape["N"] and padded["grad_norm"] > 0
        for arm in shape["arms"][1:]:
            # Same state, prompts and key: the compacting sampler draws the static one's
            # tokens, so every update sees one batch and computes one loss and gradient norm.
            packed = step[arm]
            assert packed["same_tokens"]
            assert packed["loss_diff"] <= 1e-5 * max(1.0, abs(padded["loss"]))
            assert packed["grad_norm_diff"] <= 1e-4 * padded["grad_norm"]
            assert packed["rows"] in buckets[arm]
            assert padded["real_tokens"] == packed["real_tokens"] > 0
            assert 0 <= packed["update_padding"] <= padded["update_padding"] < 1
            assert 0 <= packed["sampler_padding"] <= padded["sampler_padding"] < 1
    for arm in shape["arms"]:
        m = shape["summary"][arm]
        assert all(_positive(m[f"{n}_s"]) for n in ("step", "sample", "update"))
    assert timed["padded"]["compile_excluded_s"] == 0  # the padded update compiled in warm-up
    return shape


def test_bench_padding_smoke_alternates_both_arms_on_the_same_tokens(tmp_path, capsys):
    # --compact_floor 0: the packed arm packs the update only and samples with the padded
    # arm's program (compiled once); the compacting sampler compiles ~5 s more under load,
    # so that run is the slow test below. --pack batch: the rows counted per batch shard
    # (the GROUP update has bench_rl_step's smoke; both arms together: the slow test).
    shape = _padding_smoke(tmp_path, "--compact_floor", "0", "--pack", "batch")
    assert shape["compact_sizes"] == [32] and shape["arms"] == ["padded", "packed_batch"]
    # 8 groups over the test suite's 8 devices: a shard is one group, rows of its 4.
    assert shape["batch_buckets"] == [1, 2, 3, 4]
    text = capsys.readouterr().out
    assert len(_table(text, "| step |")) == 2 and len(_table(text, "| arm |")) == 2


@pytest.mark.slow
def test_bench_padding_smoke_with_a_compacting_sampler(tmp_path):
    shape = _padding_smoke(tmp_path, "--pack", "group,batch")
    assert shape["compact_sizes"] == [32, 16, 8]
    assert shape["arms"] == ["padded", "packed", "packed_batch"]
    # The random-init model's lengths at T = 16 leave fewer than half the rows live at the
    # end of the first step, so the compacting sampler ran fewer row-steps.
    first = shape["steps"][0]
    assert first["packed"]["sampler_padding"] < first["padded"]["sampler_padding"]


def test_bench_padding_builds_its_smollm2_arm_from_bench_trls_config():
    """The smollm2 shape (not run by the smokes: it loads the real model) is bench_trl's
    padded config at 4 x 8 x --tokens; it broke once when bench_trl.config gained an
    argument (--packed) that bench_padding's namespace did not carry."""
    args = bench_padding.parse_args(["--tokens=128"])
    cfg = bench_padding.config("smollm2", args)
    assert (cfg.batch_prompts, cfg.samples, cfg.max_new_tokens) == (4, 8, 128)
    assert cfg.rl.pack.name == "OFF" and cfg.sampler_compact_floor == 0
