"""Carrying a long table's finished work from one machine to the next.

A table that takes more CPU than one session (table 7: about 10 hours on 2 cores) must
survive its machine being replaced between sessions: only the repository goes on. `save`
copies what a later session cannot redo cheaply out of the table's workdir into a folder
of the repository: every finished run's result.json (its row: status, metrics, wall time,
config fingerprint and provenance) with its metrics.jsonl (the run's curve), and the shared
start evaluations (WORKDIR/_start_evals, kjax.rl.start_evals: the verdicts of a step-0
draw, reused by the runs of a seed not yet trained). `restore` copies them back into a new
workdir at the same places, so the table's own resume (experiments.lab.table_runs) skips
those runs and their start draws: a restored result.json is checked against the config the
table asks for, like any other, and a run of another config is an error there.

Left behind: checkpoints (a LoRA run's adapters and optimizer state, tens of MB each) and
the generated data. A run unfinished when the machine goes is trained again from its start.

  python -m experiments.lab.carry save --workdir=DIR --to=FOLDER
  python -m experiments.lab.carry restore --workdir=DIR --from=FOLDER

Neither overwrites: a file already at its destination with other bytes is an error naming
both (nothing is copied), so a folder of another table, or of a run redone differently, is
never mixed in silently. `save` into a git work tree refuses (before copying) a destination
that git ignores, naming the ignore rule: a carried file that `git add` skips is lost with
the machine as surely as the workdir (the repository's `runs/` rule once hid table 7's
reported runs this way).
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
from collections.abc import Iterator

from experiments.lab.harness import START_EVALS
from experiments.lab.table_runs import TornResult, read_result
from kjax.files import write_atomic


def carried(workdir: pathlib.Path) -> Iterator[pathlib.Path]:
    """The files of workdir that save carries, relative to it, in a stable order: finished
    runs' result.json (status ok or diverged; torn ones are left: their run is redone) and
    run/metrics.jsonl beside them, and every start evaluation (*.npz under a _start_evals)."""
    for path in sorted(workdir.rglob("result.json")):
        try:
            row = read_result(path)
        except TornResult:
            continue
        if row.get("status") not in ("ok", "diverged"):
            continue
        yield path.relative_to(workdir)
        curve = path.parent / "run" / "metrics.jsonl"
        if curve.is_file():
            yield curve.relative_to(workdir)
    for path in sorted(workdir.rglob(f"{START_EVALS}/*.npz")):
        yield path.relative_to(workdir)


def copy_tree(files: list[pathlib.Path], src: pathlib.Path, dst: pathlib.Path) -> int:
    """Copies src/f to dst/f for f in files; returns how many were new. A file present at
    dst with other bytes is a FileExistsError naming both, raised before anything is copied."""
    clashes = [
        f for f in files if (dst / f).exists() and (dst / f).read_bytes() != (src / f).read_bytes()
    ]
    if clashes:
        f = clashes[0]
        raise FileExistsError(
            f"{dst / f} exists and differs from {src / f} ({len(clashes)} such file(s)): "
            "another run's result, or a run redone since. Move the one you do not want "
            "aside, or carry into an empty folder."
        )
    new = 0
    for f in files:
        if not (dst / f).exists():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            write_atomic(dst / f, (src / f).read_bytes())
            new += 1
    return new


class IgnoredByGit(Exception):
    """save's destination lies in a git work tree that ignores some of what it carries."""


def git_ignored(paths: list[pathlib.Path]) -> list[str]:
    """`git check-ignore -v` lines (rule, then path) for the paths git would not add; [] when
    none is ignored, or when they are not in a git work tree (or git is absent)."""
    if not paths:
        return []
    top = paths[0].parent
    while not top.exists():
        top = top.parent
    try:
        proc = subprocess.run(["git", "-C", str(top), "check-ignore", "-v", "--stdin"],
                              input="\n".join(str(p.absolute()) for p in paths),
                              capture_output=True, text=True, check=False)  # fmt: skip
    except FileNotFoundError:  # no git: nothing to check against
        return []
    if proc.returncode != 0:  # 1: none ignored; 128: not in a work tree
        return []
    # -v also prints a path a "!" rule re-includes: "SOURCE:LINE:PATTERN<tab>PATH"
    return [ln for ln in proc.stdout.splitlines() if not ln.split(":", 2)[-1].startswith("!")]


def save(workdir: pathlib.Path, to: pathlib.Path) -> str:
    if not workdir.is_dir():
        raise FileNotFoundError(f"--workdir={workdir}: no such folder")
    files = list(carried(workdir))
    ignored = git_ignored([to / f for f in files])
    if ignored:
        raise IgnoredByGit(
            f"--to={to}: git ignores {len(ignored)} of the {len(files)} file(s) to carry, so "
            f"a commit would leave them behind; first: {ignored[0]} (rule, then path). Add a "
            "'!' rule for that folder to the .gitignore named, or carry elsewhere; nothing "
            "was copied."
        )
    new = copy_tree(files, workdir, to)
    runs = sum(f.name == "result.json" for f in files)
    evals = sum(f.suffix == ".npz" for f in files)
    size = sum((to / f).stat().st_size for f in files)
    return (
        f"saved {runs} finished run(s) and {evals} start evaluation(s) of {workdir} into "
        f"{to} ({new} new file(s), {size / 1e6:.1f} MB in all)"
    )


def restore(workdir: pathlib.Path, src: pathlib.Path) -> str:
    if not src.is_dir():
        raise FileNotFoundError(f"--from={src}: no such folder (saved by `carry save`)")
    files = sorted(p.relative_to(src) for p in src.rglob("*") if p.is_file())
    new = copy_tree(files, src, workdir)
    runs = sum(f.name == "result.json" for f in files)
    return (
        f"restored {runs} finished run(s) from {src} into {workdir} ({new} new file(s)); "
        "rerun the table's command there to go on"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.lab.carry", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("save", help="copy finished work out of a table's workdir")
    s.add_argument("--workdir", required=True, type=pathlib.Path)
    s.add_argument("--to", required=True, type=pathlib.Path)
    r = sub.add_parser("restore", help="copy saved work into a (new) workdir")
    r.add_argument("--workdir", required=True, type=pathlib.Path)
    r.add_argument("--from", dest="src", required=True, type=pathlib.Path)
    args = p.parse_args(argv)
    try:
        if args.what == "save":
            print(save(args.workdir, args.to))
        else:
            print(restore(args.workdir, args.src))
    except (FileNotFoundError, FileExistsError, IgnoredByGit) as e:
        print(f"carry: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
