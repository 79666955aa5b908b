"""Issue 48 (docs/errors.md): a lagged run evaluated safely, even beside its live trainer
and on another device count; one writer per workdir; lag settings, model files, a full
disk and a broken task module each refused with a message naming the input and the fix,
exit 2, no traceback, and the corrected command then succeeding in the same workdir.

One tiny lagged run (module fixture) serves every case: the failing commands run in its
workdir first, then the corrected one trains it (4 steps at rl.policy_lag=1)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from experiments import evaluate, train
from experiments.lab import harness, table_runs
from experiments.lab.harness import Arm
from experiments.tables import inference_strategies
from kjax import checkpoint, files, tokenizer
from kjax.models import load
from tests.experiments.test_bad_input import ROOT, TINY, _Capture, _clean, _table

LAG = [TINY, "--config.rl.microbatches=1", "--config.steps=4", "--config.checkpoint.every=1",
       "--config.checkpoint.keep=2", "--config.rl.policy_lag=1"]  # fmt: skip
BROKEN_TASK = "kjax_issue48_task"  # a user's task package whose module fails at import


def _enospc(*a, **k):
    raise OSError(28, "No space left on device", "injected")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run_safety")
    workdir, cap = root / "run", _Capture()
    wd = f"--workdir={workdir}"
    package = root / "user" / BROKEN_TASK
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "syntax.py").write_text("def f(:\n    pass\n")
    (package / "raises.py").write_text("import os\n\nraise RuntimeError('no GPU for my task')\n")
    sys.path.insert(0, str(root / "user"))
    plain = [a for a in LAG if "policy_lag" not in a]
    failed = {
        "exact_at_0": cap.run(train.main, [*plain, wd, "--config.rl.lag_correction=EXACT"]),
        "sampler_at_0": cap.run(train.main, [*plain, wd, "--config.mesh.sampler_devices=4"]),
        "sampler_mesh": cap.run(
            train.main, [*LAG, wd, "--config.mesh.sampler_devices=2", "--config.mesh.data=4"]
        ),
        "path_without_kind": cap.run(train.main, [*LAG, wd, f"--config.model.path={root}"]),
        "syntax": cap.run(train.main, [*LAG, wd, f"--config.task.kind={BROKEN_TASK}.syntax"]),
        "raises": cap.run(train.main, [*LAG, wd, f"--config.task.kind={BROKEN_TASK}.raises"]),
    }
    sys.path.remove(str(root / "user"))
    with pytest.MonkeyPatch.context() as m:  # array_record's words for a full disk
        m.setattr(tfds.core.DatasetBuilder, "download_and_prepare",
                  lambda *a, **k: (_ for _ in ()).throw(RuntimeError(
                      "ResourceExhausted: write failed: No space left on device")))  # fmt: skip
        failed["disk_data"] = cap.run(train.main, [*LAG, wd])
    claimed = (workdir / "experiment.json").exists()
    rows, append = [], files.append_line

    def full_at_step_2(path, line):  # the disk fills up after two rows (steps 0 and 1)
        if len(rows) == 2:
            _enospc()
        rows.append(line)
        append(path, line)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(files, "append_line", full_at_step_2)
        failed["disk_run"] = cap.run(train.main, [*LAG, wd])
    trained = cap.run(train.main, [*LAG, wd])
    return dict(root=root, workdir=workdir, failed=failed, claimed=claimed, trained=trained)


def test_each_refused_command_names_input_and_fix_and_the_corrected_one_trains(run):
    says = {
        "exact_at_0": ["`config.rl.lag_correction` is EXACT at rl.policy_lag=0", "not a no-op",
                       "set rl.lag_correction=NONE"],
        "sampler_at_0": ["`config.mesh.sampler_devices` is a sampling group", "rl.policy_lag=0",
                         "Set rl.policy_lag >= 1, or mesh.sampler_devices=0"],
        "sampler_mesh": ["does not divide the 6 devices", "mesh.sampler_devices=2 took 2 of the 8",
                         "lower mesh.sampler_devices"],
        "path_without_kind": ["`config.model.path` is set but model.kind is TINY",
                              "--config.model.kind=hf_dir"],
        "syntax": [f"`config.task.kind` '{BROKEN_TASK}.syntax'", "SyntaxError",
                   "syntax.py\", line 1", "fix it and rerun"],
        "raises": [f"'{BROKEN_TASK}.raises'", "raises.py\", line 3",
                   "RuntimeError: no GPU for my task"],
        "disk_data": ["no space left on the disk of", "data are safe",
                      "rerun the same command"],
        "disk_run": ["no space left on the disk of injected", "each checkpoint takes",
                     "step 1 is the last complete one", "rerun the same command"],
    }  # fmt: skip
    for name, (rc, _, err) in run["failed"].items():
        assert rc == 2 and _clean(err), (name, err)
        assert all(w in err for w in says[name]), (name, err)
    assert "importlib" not in run["failed"]["raises"][2]  # the user's frames only
    assert "kjax/" not in run["failed"]["raises"][2]
    lines = run["failed"]["disk_run"][2].lower().splitlines()  # progress bar lines beside it
    assert sum("no space left" in line for line in lines) == 1  # said once
    assert not run["claimed"]  # nothing claimed before the disk filled up mid-run
    rc, out, _ = run["trained"]  # the corrected command: resumes from step 1
    assert rc == 0 and "pass@1=" in out
    steps = [r["step"] for r in files.read_jsonl(run["workdir"] / "metrics.jsonl")]
    assert steps == [0, 1, 2, 3, 4]


def _params(workdir: pathlib.Path):
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    policy = inference_strategies.load_policy(workdir, problems=8, restore=False)
    like = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one),
                        policy.params)  # fmt: skip
    return checkpoint.read_params(workdir / "checkpoints", like)


def _listing(directory: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def test_evaluate_reads_a_lagged_run_on_one_device_and_writes_nothing_of_the_trainers(run):
    workdir = run["workdir"]
    before = _listing(workdir / "checkpoints")
    rc, out, err = _Capture().run(evaluate.main, [f"--workdir={workdir}", "--n=4"])
    assert rc == 0, err
    assert "| all | 8 |" in out
    assert _listing(workdir / "checkpoints") == before
    # Saved on the 8 test devices; read in a process that has one.
    env = {**os.environ, "XLA_FLAGS": os.environ["XLA_FLAGS"].replace("count=8", "count=1")}
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.evaluate", f"--workdir={workdir}", "--n=2"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| all | 8 |" in proc.stdout
    assert _listing(workdir / "checkpoints") == before


@pytest.mark.slow  # a second process trains the run again (~80 s of wall time under load)
def test_evaluate_beside_a_live_trainer_leaves_it_bit_identical(run, tmp_path):
    """A trainer (its own process) trains the fixture's run again while evaluate reads its
    workdir over and over; it ends with the very parameters and losses of the undisturbed
    fixture run."""
    live = tmp_path / "live"
    trainer = subprocess.Popen(
        [sys.executable, "-m", "experiments.train", *LAG, f"--workdir={live}"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    evaluated, deadline = 0, time.time() + 600
    while trainer.poll() is None and time.time() < deadline:
        if not checkpoint.has_checkpoint(live / "checkpoints"):
            time.sleep(0.2)
            continue
        rc, _, err = _Capture().run(evaluate.main, [f"--workdir={live}", "--n=2"])
        assert rc == 0 or "every checkpoint was replaced" in err, err
        evaluated += trainer.poll() is None  # finished while the trainer still ran
    assert trainer.wait(timeout=60) == 0, trainer.stderr.read()[-3000:]
    assert evaluated >= 1  # evaluate really ran beside the trainer
    got, step = _params(live)
    want, want_step = _params(run["workdir"])
    assert step == want_step == 4
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    def losses(w):
        return [r["loss"] for r in files.read_jsonl(w / "metrics.jsonl") if "loss" in r]

    assert losses(live) == losses(run["workdir"])


def test_a_second_writer_is_refused_naming_the_holder_and_a_killed_ones_lock_is_taken(run):
    workdir = run["workdir"]
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from kjax import writer_lock; "
         f"f = writer_lock.acquire({str(workdir)!r}); print('held', flush=True); time.sleep(600)"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        rc, _, err = _Capture().run(train.main, [*LAG, f"--workdir={workdir}"])
        assert rc == 2 and _clean(err), err
        assert f"pid {holder.pid} on host {socket.gethostname()}, started " in err
        assert "Wait for it to finish or stop it" in err and "another --workdir" in err
    finally:
        holder.kill()  # kill -9: its lock is stale
        holder.wait()
    rc, out, err = _Capture().run(train.main, [*LAG, f"--workdir={workdir}"])
    assert rc == 0, err  # the finished run, resumed: nothing left to do
    steps = [r["step"] for r in files.read_jsonl(workdir / "metrics.jsonl")]
    assert steps == [0, 1, 2, 3, 4]


def _edit_identity(workdir: pathlib.Path, change) -> str:
    path = workdir / "experiment.json"
    text = path.read_text()
    ident = json.loads(text)
    change(ident)
    path.write_text(json.dumps(ident))
    return text


def test_extending_a_lagged_run_and_another_models_checkpoint_are_refused(run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(run["workdir"], copy, ignore=shutil.ignore_patterns("writer.lock"))
    wd = f"--workdir={copy}"
    cap = _Capture()
    # Steps raised in experiment.json, as extends a synchronous run.
    original = _edit_identity(copy, lambda i: i.update(steps=6))
    rc, _, err = cap.run(train.main, [*LAG, wd, "--config.steps=6"])
    assert rc == 2 and _clean(err), err
    for words in ("rl.policy_lag=1", "checkpointed at step 4", "steps=6",
                  "could not equal one trained for 6 steps", "new --workdir",
                  "set steps back to 4"):  # fmt: skip
        assert words in err, (words, err)
    (copy / "experiment.json").write_text(original)
    # experiment.json says another model's sizes than the checkpoint's.
    _edit_identity(copy, lambda i: i["model"].update(hidden_size=16, num_heads=2))
    for main, argv in (
        (evaluate.main, [wd, "--n=2"]),
        (train.main, [*LAG, wd, "--config.model.hidden_size=16"]),
    ):
        rc, _, err = cap.run(main, argv)
        assert rc == 2 and _clean(err), err
        assert f"{copy / 'checkpoints' / '4'} holds a model of other sizes" in err
        assert "32) there, " in err and "16) here" in err and "its experiment.json" in err
    (copy / "experiment.json").write_text(original)  # the fixes
    assert cap.run(train.main, [*LAG, wd])[0] == 0
    assert cap.run(evaluate.main, [wd, "--n=2"])[0] == 0


# ------------------------------------------------------------------------------ model files


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random Qwen3 with a character tokenizer, saved as transformers does."""
    from tests.models.hf_reference import random_family_model
    from tests.rl.test_family_runs import _char_tokenizer

    path = tmp_path_factory.mktemp("model") / "qwen3"
    chars = _char_tokenizer()
    model = random_family_model("qwen3", seed=0, std=0.05, vocab_size=len(chars),
                                hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                eos_token_id=chars.eos_token_id,
                                max_position_embeddings=64)  # fmt: skip
    model.save_pretrained(str(path))
    chars.save_pretrained(str(path))
    return path


def test_broken_model_files_are_named_with_the_fix(model_dir, tmp_path, capsys):
    def train_on(path):
        argv = [*LAG, f"--workdir={tmp_path / 'w'}", "--config.model.kind=hf_dir",
                f"--config.model.path={path}"]  # fmt: skip
        rc, out, err = _Capture().run(train.main, argv)
        return rc, err

    broken = tmp_path / "broken"

    def case(damage, *words):
        shutil.copytree(model_dir, broken, dirs_exist_ok=True)
        damage(broken)
        rc, err = train_on(broken)
        assert rc == 2 and _clean(err), (words, err)
        assert all(w in err for w in words), (words, err)
        shutil.rmtree(broken)

    def cut(name, keep):
        return lambda d: (d / name).write_bytes((d / name).read_bytes()[:keep])

    case(cut("model.safetensors", 3000), "model.safetensors is truncated",
         "download or save it again")  # fmt: skip
    case(cut("config.json", 120), "config.json is not valid JSON",
         "copy the model's config.json")  # fmt: skip
    case(lambda d: [(d / n).unlink() for n in ("tokenizer.json",)],
         "has no tokenizer", "copy the model's tokenizer files")  # fmt: skip

    # A folder whose tokenizer lost its chat template (tokenizer_config.json cut down).
    def no_template(d):
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        cfg.pop("chat_template", None)
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
        (d / "chat_template.jinja").unlink(missing_ok=True)

    shutil.copytree(model_dir, broken)
    no_template(broken)
    with pytest.raises(ValueError, match="has no chat template .*copy the model's tokenizer"):
        tokenizer.load(str(broken)).encode_chat([{"role": "user", "content": "1+1"}])
    shutil.rmtree(broken)
    for name, data, words in (
        ("not.gguf", b"PK\x03\x04 a zip file", "is not a GGUF file"),
        ("empty.gguf", b"", "is empty (0 bytes"),
    ):
        (tmp_path / name).write_bytes(data)
        rc, err = train_on(tmp_path / name)
        assert rc == 2 and _clean(err) and words in err and f"{tmp_path / name}" in err, err
    assert not (tmp_path / "w" / "experiment.json").exists()
    # The corrected command: the intact folder trains, in the same workdir.
    assert load(str(model_dir)).config.hidden_size == 32
    assert tokenizer.load(str(model_dir)).encode_chat([{"role": "user", "content": "1"}])
    rc, err = train_on(model_dir)
    assert rc == 0, err
    assert (tmp_path / "w" / "experiment.json").exists()


# ---------------------------------------------------------------------------------- tables


def test_the_last_worker_shows_the_arm_another_worker_finished(tmp_path):
    """Worker 1 trains arm a (holds its lock); worker 2 finds it running, trains b, and
    worker 1 finishes a meanwhile: worker 2's table, written last, shows a's result."""
    import fcntl

    calls = []
    table = _table(calls, Arm("a", lambda c: c), Arm("b", lambda c: c))
    a_dir = tmp_path / "runs" / "a" / "seed0"
    a_dir.mkdir(parents=True)
    lock = open(a_dir / "lock", "w")  # noqa: SIM115 - worker 1's lock
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    execute = table.execute

    def worker_2(table, arm, seed, run_dir, ctx):
        table_runs.write_result(a_dir / "result.json",  # worker 1 finishes a now
                                {"table": "t", "arm": "a", "seed": 0, "status": "ok",
                                 "metrics": {"m": 0.5}, "wall_s": 1.0})  # fmt: skip
        lock.close()
        return execute(table, arm, seed, run_dir, ctx)

    import dataclasses

    table = dataclasses.replace(table, execute=worker_2)
    lines = []
    ctx = harness.Context(tmp_path, tmp_path / "sft", smoke=False, log=lines.append)
    rows = table_runs.run_table(table, [0], ctx)
    assert [(r["arm"], r["status"]) for r in rows] == [("a", "ok"), ("b", "ok")]
    assert rows[0]["metrics"]["m"] == 0.5
    # A run announces itself when it starts (a table's runs take minutes to hours each).
    started = [line for line in lines if " seed 0: training in " in line]
    assert len(started) == 1 and "] b seed 0: training in " in started[0], lines


def test_a_lag_beyond_the_steps_is_named_in_the_log():
    import dataclasses

    from kjax.rl.components import _warn_lag
    from tests.rl.tiny_run import TINY as TINY_CFG

    lines = []
    for lag, steps in ((1, 4), (5, 4)):
        rl = dataclasses.replace(TINY_CFG.rl, policy_lag=lag)
        _warn_lag(dataclasses.replace(TINY_CFG, rl=rl, steps=steps), lines.append)
    assert "from the parameters of 1 update(s) ago" in lines[0]
    assert "rl.policy_lag >= steps=4, so no rollout comes from a trained policy" in lines[1]
    assert "lower rl.policy_lag, or raise steps" in lines[1]


def test_lockstep_says_it_does_not_apply_to_a_lagged_arm(tmp_path):
    import dataclasses

    from tests.rl.tiny_run import TINY as TINY_CFG

    lagged = dataclasses.replace(TINY_CFG, rl=dataclasses.replace(TINY_CFG.rl, policy_lag=1))
    table = dataclasses.replace(_table([], Arm("lagged", lambda c: c)), execute=None,
                                base=lambda seed, smoke: lagged)  # fmt: skip
    lines = []
    ctx = harness.Context(tmp_path, tmp_path / "sft", smoke=False, log=lines.append, lockstep=2)
    table_runs.lockstep(table, table.arms[0], [0, 1], ctx)
    assert any("--lockstep=2 does not apply to arm 'lagged'" in x and "rl.policy_lag > 0" in x
               and "train one at a time" in x for x in lines), lines  # fmt: skip


def test_a_full_disk_silences_only_the_failed_saves_noise():
    """What orbax's failed saves print through sys.excepthook (a closed event loop, a full
    disk) is held back for the one message; anything else still prints."""
    from kjax import disk

    seen = []
    hook = disk.quiet_excepthook(lambda kind, value, tb: seen.append(value))
    full = OSError(28, "No space left on device", "f")
    for error in (RuntimeError("Event loop is closed"), full, RuntimeError("a bug")):
        hook(type(error), error, None)
    assert [str(e) for e in seen] == ["a bug"]
    assert disk.is_disk_full(RuntimeError("wrapped")) is False
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = full
    assert disk.is_disk_full(wrapped)
