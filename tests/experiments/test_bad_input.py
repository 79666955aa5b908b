"""Mistakes and torn files (docs/errors.md): each gets a message naming the input and the
fix, a non-zero exit (2 for usage), no traceback, and leaves the workdir to the corrected
command. One tiny trained run (module fixture) serves the train and evaluate cases; the
table cases use stand-in configs and train no model."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys

import pytest

from experiments import evaluate, train
from experiments.lab import harness, table_cli
from experiments.lab.claims import Claim
from experiments.lab.harness import Arm
from kjax import files, tasks
from kjax.data import builders, loader
from kjax.rl.config import CodeConfig, SFTConfig, TrainConfig

ROOT = pathlib.Path(__file__).parent.parent.parent
TINY = f"--config={ROOT / 'tests' / 'rl' / 'tiny_run.py'}:tiny"
ONE = "--config.rl.microbatches=1"  # B=8 over the 8 test devices
FIXTURES = pathlib.Path(__file__).parent.parent / "data" / "fixtures"
READ_ONLY = pathlib.Path("/sys/kjax_workdir")  # a read-only file system, even for root


def _train(capsys, *args) -> tuple[int, str, str]:
    rc = train.main([*args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _clean(err: str) -> bool:
    """An error a user reads: one message, no traceback, no doubled full stop."""
    return "Traceback" not in err and not re.search(r"[^.]\.\.(\s|$)", err) and err.strip()


def _tb_steps(tb_dir: pathlib.Path, tag: str) -> list[int]:
    """The steps of `tag`'s scalars in a TensorBoard folder's event files (TFRecords)."""
    from tensorboardX.proto import event_pb2

    steps = []
    for path in sorted(tb_dir.glob("events.*")):
        data, i = path.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i : i + 8])
            event = event_pb2.Event.FromString(data[i + 12 : i + 12 + n])
            steps += [event.step for v in event.summary.value if v.tag == tag]
            i += 12 + n + 4
    return sorted(steps)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A workdir where two commands failed before the corrected one trained: a negative
    seed, then the code task with no train.jsonl (a late error, after the workdir check).
    Then the tiny run for 4 steps, checkpoints at 2 and 4, sft.cache_dir spelled absolute
    (part of the run's identity even without SFT steps), eval.problems beyond the 8 test
    problems."""
    root = tmp_path_factory.mktemp("bad_input")
    workdir, capsys = root / "run", _Capture()
    manual = root / "code"
    (manual / "code_contests").mkdir(parents=True)
    shutil.copy(FIXTURES / "code_contests" / "test.jsonl", manual / "code_contests")
    code = ["--config.task.kind=code", f"--config.task.manual_dir={manual}"]
    failed = [
        capsys.run(train.main, [TINY, ONE, f"--workdir={workdir}", "--config.seed=-1"]),
        capsys.run(train.main, [TINY, ONE, f"--workdir={workdir}", *code]),
    ]
    claimed = (workdir / "experiment.json").exists()
    args = [TINY, ONE, f"--workdir={workdir}",
            "--config.steps=4", "--config.checkpoint.every=2", "--config.eval.problems=16",
            f"--config.sft.cache_dir={root / 'sft'}"]  # fmt: skip
    trained = capsys.run(train.main, args)
    return dict(root=root, workdir=workdir, failed=failed, claimed=claimed, trained=trained,
                args=args)  # fmt: skip


class _Capture:
    """Runs a CLI's main in-process and keeps (exit status, stdout, stderr)."""

    def run(self, main, argv):
        import contextlib
        import io

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
        return rc, out.getvalue(), err.getvalue()


def test_failed_commands_leave_the_workdir_to_the_corrected_one(run):
    (rc_seed, _, err_seed), (rc_code, _, err_code) = run["failed"]
    assert rc_seed == 2 and "`config.seed` must be an int >= 0; got -1" in err_seed
    assert rc_code == 2 and "code_contests/train.jsonl" in err_code and "Put them there" in err_code
    assert _clean(err_seed) and _clean(err_code)
    assert not run["claimed"]  # nothing claimed: the corrected command trains there
    rc, out, _ = run["trained"]
    assert rc == 0 and "pass@1=" in out
    # eval.problems beyond the test split is said, not silently clipped
    assert "note: eval.problems=16 but the test split has 8 problems" in out
    steps = [r["step"] for r in files.read_jsonl(run["workdir"] / "metrics.jsonl")]
    assert steps == [0, 1, 2, 3, 4]


def test_resume_repairs_a_torn_tail_trims_tensorboard_and_ignores_the_path_spelling(
    run, monkeypatch
):
    workdir, root = run["workdir"], run["root"]
    assert _tb_steps(workdir / "tensorboard", "loss") == [1, 2, 3, 4]
    # A kill after checkpoint 2 with step 3's row half-written: rows 3, 4 and checkpoint 4
    # are as if never written, the torn row is the file's last line.
    shutil.rmtree(workdir / "checkpoints" / "4")
    metrics = workdir / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join(lines[:3]) + "\n" + lines[3][:25])
    # Resumed under another spelling of the warm start's folder (relative, not absolute).
    monkeypatch.chdir(root)
    args = [a if "sft.cache_dir" not in a else "--config.sft.cache_dir=sft" for a in run["args"]]
    rc = train.main(args)
    assert rc == 0
    assert [r["step"] for r in files.read_jsonl(metrics)] == [0, 1, 2, 3, 4]
    assert _tb_steps(workdir / "tensorboard", "loss") == [1, 2, 3, 4]  # redone steps once
    # A torn line that is not the last is named, with the fix.
    metrics.write_text("\n".join(lines[:2]) + "\n{torn\n" + "\n".join(lines[2:]) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 3 is not JSON.*delete that line"):
        files.read_jsonl(metrics)
    metrics.write_text("\n".join(lines) + "\n")


def test_evaluate_refuses_bad_sampling_and_a_run_without_checkpoint(run, capsys):
    workdir = run["workdir"]
    for flag, words in (
        ("--temperature=0", "--temperature must be > 0"),
        ("--temperature=-1", "--temperature must be > 0"),
        ("--max_new_tokens=0", "--max_new_tokens must be >= 1"),
    ):
        with pytest.raises(SystemExit) as e:
            evaluate.main([f"--workdir={workdir}", "--n=4", flag])
        assert e.value.code == 2 and words in capsys.readouterr().err
    assert not (workdir / "evaluate").exists()  # no table of wrong numbers
    assert evaluate.main([f"--workdir={workdir}", "--n=4", "--problems=100000"]) == 0
    out = capsys.readouterr()
    assert "note: --problems=100000 but arith's test split has 8 problems" in out.err
    assert "| all | 8 |" in (workdir / "evaluate" / "arith.md").read_text()
    bare = run["root"] / "untrained"
    bare.mkdir()
    shutil.copy(workdir / "experiment.json", bare)
    with pytest.raises(SystemExit) as e:
        evaluate.main([f"--workdir={bare}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "no checkpoint in" in err and "train it first" in err
    assert _clean(err) and not (bare / "checkpoints").exists()


def test_train_names_the_flag_the_file_or_the_folder(tmp_path, capsys):
    not_config = tmp_path / "notes.py"
    not_config.write_text("x = 1\n")
    (tmp_path / "file").write_text("a regular file")
    workdir = f"--workdir={tmp_path / 'w'}"
    for argv, words in (
        ([f"--config={not_config}", workdir], "is not a config file (it defines no get_config"),
        (
            [TINY, workdir, "--config.optimizer.learning_rate=-1"],
            "`config.optimizer.learning_rate`",
        ),
        ([TINY, ONE, f"--workdir={tmp_path / 'file' / 'run'}"], "(Not a directory); give"),
        ([TINY, ONE, f"--workdir={READ_ONLY}"], f"--workdir={READ_ONLY}: cannot write"),
    ):
        rc, _, err = _train(capsys, *argv)
        assert rc == 2 and words in err and _clean(err), (argv, err)
    assert "not read-only, not under a file" in err
    assert not (tmp_path / "w" / "experiment.json").exists()


def test_a_backend_the_machine_lacks_is_named_with_the_fix(tmp_path, capsys, monkeypatch):
    import jax

    def no_gpu():  # what jax.device_count() raises under JAX_PLATFORMS=gpu on a CPU machine
        raise RuntimeError("Unable to initialize backend 'rocm': Backend 'rocm' is not in the "
                           "list of known backends: ['cpu', 'tpu'].")  # fmt: skip

    monkeypatch.setenv("JAX_PLATFORMS", "gpu")
    monkeypatch.setattr(jax, "device_count", no_gpu)
    rc, _, err = _train(capsys, TINY, ONE, f"--workdir={tmp_path}")
    assert rc == 2 and "JAX cannot start its backend (JAX_PLATFORMS='gpu')" in err
    assert "Set JAX_PLATFORMS" in err and _clean(err)
    assert not (tmp_path / "experiment.json").exists()


@pytest.mark.slow
def test_a_backend_the_machine_lacks_is_named_in_a_fresh_process(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "gpu"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "experiments.train", TINY, ONE, f"--workdir={tmp_path}"]
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    if p.returncode == 0:
        pytest.skip("this machine has a GPU")
    assert p.returncode == 2, p.stderr
    assert "JAX_PLATFORMS='gpu'" in p.stderr and "Set JAX_PLATFORMS" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "experiment.json").exists()


def test_code_data_missing_a_split_is_named_and_never_cached(tmp_path):
    manual = tmp_path / "manual"
    (manual / "code_contests").mkdir(parents=True)
    cfg = CodeConfig(manual_dir=str(manual))
    with pytest.raises(ValueError, match=r"no .*code_contests/train.jsonl and no .*test.jsonl"):
        tasks.load(cfg, None, tmp_path / "data", 4)  # an empty folder
    shutil.copy(FIXTURES / "code_contests" / "test.jsonl", manual / "code_contests")
    with pytest.raises(ValueError, match=r"no .*code_contests/train.jsonl; this task reads"):
        tasks.load(cfg, None, tmp_path / "data", 4)
    shutil.copy(FIXTURES / "code_contests" / "test.jsonl", manual / "code_contests/train.jsonl")
    task = tasks.load(cfg, None, tmp_path / "data", 4)  # the fix works in the same folder
    assert len(task.train) and len(task.test)
    # A dataset an older kjax prepared without the train split is named, with the fix.
    old = tmp_path / "old"
    loader.prepare(builders.CodeJsonl, old, config="code_contests", manual_dir=FIXTURES)
    with pytest.raises(ValueError, match=r"has no train split; delete .*code_jsonl"):
        tasks.load(CodeConfig(manual_dir=str(manual)), None, old, 4)


def test_config_errors_found_late_are_found_first():
    code = dataclasses.replace(TrainConfig(), task=CodeConfig(manual_dir="x"))
    with pytest.raises(ValueError, match=r"`config.sft.steps` must be 0 for the code task"):
        dataclasses.replace(code, sft=SFTConfig(steps=10)).validate(8)
    code.validate(8)


# --------------------------------------------------------------------------------- tables


@dataclasses.dataclass(frozen=True)
class _SFT:
    steps: int = 0
    cache_dir: str = ""
    seed: int | None = None


@dataclasses.dataclass(frozen=True)
class _Config:
    """Just enough of a TrainConfig for a table: its warm start's folder, a value, validate."""

    seed: int = 0
    sft: _SFT = _SFT(seed=0)
    value: float = 0.5

    def validate(self, devices):
        return self


def _table(calls: list, *arms: Arm, **kw) -> harness.Table:
    def execute(table, arm, seed, run_dir, ctx):
        calls.append((arm.name, seed))
        return {"m": harness.arm_config(table, arm, seed, ctx).value + 0.01 * seed}

    return harness.Table("t", "t", arms, (Claim("1", "b beats a", "m", "b", "a"),),
                         (("m", "m"),), lambda seed, smoke: _Config(), "b", execute=execute,
                         plot=lambda *a: None, **kw)  # fmt: skip


def _arms():
    return Arm("a", lambda c: c), Arm("b", lambda c: dataclasses.replace(c, value=0.7))


def test_a_table_workdir_resumes_under_any_spelling_of_its_path(tmp_path, monkeypatch):
    calls = []
    table = _table(calls, *_arms())
    monkeypatch.chdir(tmp_path)
    assert table_cli.main(table, ["--workdir=tab", "--seeds=1"]) == 0
    assert len(calls) == 2
    assert table_cli.main(table, [f"--workdir={tmp_path / 'tab'}", "--seeds=1"]) == 0
    (tmp_path / "tab").rename(tmp_path / "moved")
    assert table_cli.main(table, [f"--workdir={tmp_path / 'moved'}", "--seeds=1"]) == 0
    shutil.copytree(tmp_path / "moved", tmp_path / "copy")
    assert table_cli.main(table, ["--workdir=copy", "--seeds=1"]) == 0
    assert len(calls) == 2  # every rerun reused the finished runs
    # A row written before fingerprints left out the path (its legacy sha) is kept too.
    done = tmp_path / "copy" / "runs" / "b" / "seed0" / "result.json"
    ctx = harness.Context(tmp_path / "copy", tmp_path / "copy" / "sft", smoke=False)
    cfg = harness.arm_config(table, table.arms[1], 0, ctx)
    row = json.loads(done.read_text())
    legacy = harness.fingerprint(cfg)  # the folder as this process spells it
    assert row["config_sha"] == harness.fingerprint(cfg, ctx.workdir) != legacy
    done.write_text(json.dumps({**row, "config_sha": legacy}))
    assert table_cli.main(table, [f"--workdir={tmp_path / 'copy'}", "--seeds=1"]) == 0
    assert len(calls) == 2


def test_a_torn_result_is_redone_or_named_and_from_rows_is_checked(tmp_path, capsys):
    calls = []
    table = _table(calls, *_arms())
    args = [f"--workdir={tmp_path}", "--seeds=1"]
    assert table_cli.main(table, args) == 0
    done = tmp_path / "runs" / "b" / "seed0" / "result.json"
    done.write_text(done.read_text()[:40])  # a kill mid-write, by a kjax before atomic writes
    capsys.readouterr()
    assert table_cli.main(table, [*args, "--report_only"]) == 2
    err = capsys.readouterr().err
    assert f"{done} is torn" in err and "delete it and rerun without --report_only" in err
    assert _clean(err)
    assert table_cli.main(table, args) == 0  # the fix: redone, the torn file set aside
    assert calls == [("a", 0), ("b", 0), ("b", 0)]
    assert json.loads(done.read_text())["status"] == "ok"
    assert (done.parent / "result.json.torn").exists()
    assert table_cli.main(table, [*args, f"--from_rows={tmp_path / 'none.jsonl'}"]) == 2
    err = capsys.readouterr().err
    assert "--from_rows=" in err and "no such file" in err
    assert table_cli.main(table, [*args, f"--from_rows={tmp_path / 't.jsonl'}"]) == 0


def test_smoke_report_only_tabulates_a_finished_smoke_workdir(tmp_path, capsys):
    calls = []
    table = _table(calls, *_arms(), smoke_arms=("a",))
    args = [f"--workdir={tmp_path}", "--smoke"]
    assert table_cli.main(table, args) == 0 and calls == [("a", 0)]
    capsys.readouterr()
    assert table_cli.main(table, [*args, "--report_only"]) == 0, capsys.readouterr().err
    assert calls == [("a", 0)]  # nothing trained
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [(r["arm"], r["status"]) for r in rows] == [("a", "ok"), ("b", "validated")]


def test_a_raising_arm_under_lockstep_is_named(tmp_path, capsys):
    def broken(cfg):
        raise ValueError("arm bug")

    table = dataclasses.replace(
        _table([], Arm("b", broken), Arm("a", lambda c: c)), execute=None
    )  # lockstep trains tables without their own execute
    assert table_cli.main(table, [f"--workdir={tmp_path}", "--seeds=2", "--lockstep=2"]) == 1
    err = capsys.readouterr().err
    assert "arm 'b' at seeds [0, 1] (in lockstep) failed with ValueError: arm bug" in err
    assert _clean(err) and not list(tmp_path.glob("runs/b/*/result.json"))


def test_a_read_only_table_workdir_is_named(capsys):
    table = _table([], *_arms())
    assert table_cli.main(table, [f"--workdir={READ_ONLY}", "--seeds=1"]) == 2
    err = capsys.readouterr().err
    assert f"--workdir={READ_ONLY}" in err and "not read-only" in err and _clean(err)
