"""experiments.lab.carry: a table's finished runs and start draws survive a new machine, and
the table's own resume takes the restored runs as finished."""

import json
import shutil
import subprocess

import pytest

from experiments.lab import carry, table_runs


def _workdir(root):
    """A table workdir as the harness leaves it mid-way: two finished runs (one diverged),
    a torn one, one still training, a start draw, a checkpoint and generated data."""
    wd = root / "wd"
    ok = wd / "tuning" / "lr0.0001" / "mean" / "seed1000"
    (ok / "run" / "checkpoints" / "20").mkdir(parents=True)
    (ok / "run" / "checkpoints" / "20" / "adapters").write_bytes(b"x" * 1000)
    (ok / "run" / "metrics.jsonl").write_text('{"step": 0}\n{"step": 39}\n')
    (ok / "result.json").write_text(json.dumps({"status": "ok", "wall_s": 1.0}))
    div = wd / "runs" / "passk" / "seed0"
    div.mkdir(parents=True)
    (div / "result.json").write_text(json.dumps({"status": "diverged", "wall_s": 2.0}))
    torn = wd / "runs" / "passk" / "seed1"
    torn.mkdir(parents=True)
    (torn / "result.json").write_text('{"status": "o')
    busy = wd / "runs" / "passk" / "seed2" / "run"
    busy.mkdir(parents=True)
    (busy / "metrics.jsonl").write_text('{"step": 3}\n')
    (wd / "_start_evals").mkdir()
    (wd / "_start_evals" / "abc.npz").write_bytes(b"npz")
    (ok / "run" / "data").mkdir()
    (ok / "run" / "data" / "train.tfrecord").write_bytes(b"d")
    return wd


def test_save_carries_finished_runs_curves_and_start_draws_only(tmp_path):
    wd = _workdir(tmp_path)
    got = sorted(str(f) for f in carry.carried(wd))
    assert got == sorted([
        "tuning/lr0.0001/mean/seed1000/result.json",
        "tuning/lr0.0001/mean/seed1000/run/metrics.jsonl",
        "runs/passk/seed0/result.json",
        "_start_evals/abc.npz",
    ])  # fmt: skip
    out = tmp_path / "repo_folder"
    assert "saved 2 finished run(s) and 1 start evaluation(s)" in carry.save(wd, out)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == got


def test_restore_into_a_new_workdir_gives_the_runs_back_byte_for_byte(tmp_path):
    wd = _workdir(tmp_path)
    out = tmp_path / "saved"
    carry.save(wd, out)
    new = tmp_path / "new_machine"
    assert "restored 2 finished run(s)" in carry.restore(new, out)
    for f in carry.carried(wd):
        assert (new / f).read_bytes() == (wd / f).read_bytes()
    row = table_runs.read_result(new / "runs" / "passk" / "seed0" / "result.json")
    assert row["status"] == "diverged"
    assert not (new / "runs" / "passk" / "seed1").exists()  # the torn run is redone
    # saving again (the next session) is idempotent; restoring over itself too
    assert "(0 new file(s)" in carry.save(wd, out)
    assert "(0 new file(s))" in carry.restore(new, out)


def test_a_clash_copies_nothing_and_names_both_files(tmp_path):
    wd = _workdir(tmp_path)
    out = tmp_path / "saved"
    carry.save(wd, out)
    (wd / "_start_evals" / "later.npz").write_bytes(b"new")
    (wd / "runs" / "passk" / "seed0" / "result.json").write_text('{"status": "ok"}')
    with pytest.raises(FileExistsError, match="seed0/result.json exists and differs"):
        carry.save(wd, out)
    assert not (out / "_start_evals" / "later.npz").exists()  # nothing copied


def test_cli_errors_name_the_input_and_exit_non_zero(tmp_path, capsys):
    assert carry.main(["restore", f"--workdir={tmp_path / 'w'}", f"--from={tmp_path / 'no'}"]) == 2
    assert "--from=" in capsys.readouterr().err
    assert carry.main(["save", f"--workdir={tmp_path / 'none'}", f"--to={tmp_path / 'o'}"]) == 2
    assert "--workdir=" in capsys.readouterr().err
    wd = _workdir(tmp_path)
    assert carry.main(["save", f"--workdir={wd}", f"--to={tmp_path / 'o'}"]) == 0
    assert "saved 2 finished run(s)" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_save_refuses_a_destination_git_ignores_and_copies_nothing(tmp_path, capsys):
    """A carried result.json that `git add` skips is lost with the machine: the repository's
    `runs/` rule once hid table 7's reported runs (runs/ARM/seedS) this way."""
    wd = _workdir(tmp_path)
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("runs/\n")
    to = repo / "results" / "carried"
    code = carry.main(["save", f"--workdir={wd}", f"--to={to}"])
    err = capsys.readouterr().err
    assert code == 2
    assert ".gitignore:1:runs/" in err and "runs/passk/seed0/result.json" in err, err
    assert not to.exists()
    (repo / ".gitignore").write_text("runs/\n!results/*/runs/\n")
    assert carry.main(["save", f"--workdir={wd}", f"--to={to}"]) == 0
    assert (to / "runs" / "passk" / "seed0" / "result.json").is_file()
    assert not carry.git_ignored([to / f for f in carry.carried(wd)])


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_ignored_counts_only_what_git_would_skip(tmp_path):
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("runs/\n!keep/runs/\n")
    got = carry.git_ignored([repo / "keep" / "runs" / "a.json", repo / "x" / "runs" / "b.json"])
    assert len(got) == 1 and got[0].endswith("x/runs/b.json"), got
    assert carry.git_ignored([tmp_path / "elsewhere" / "runs" / "c.json"]) == []  # no repo
