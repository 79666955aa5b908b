"""Shared by the sandbox tests: skip without bwrap (fail under CI, which installs it)."""

import os
import shutil

import pytest

HAVE_BWRAP = shutil.which("bwrap") is not None


def require_bwrap():
    if HAVE_BWRAP:
        return
    if os.environ.get("CI"):
        pytest.fail("bwrap missing under CI: .ci/run must install bubblewrap")
    pytest.skip("bwrap not installed (apt-get install bubblewrap)")


def sandbox_processes() -> list[int]:
    """Live host pids owned by the sandbox uids (>= 200000): must be none between runs.

    Zombies don't count: bwrap's namespace init is reparented to the host's init, which
    reaps it on its own schedule; a zombie holds no memory and runs nothing.
    """
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = dict(ln.split(":", 1) for ln in f if ":" in ln)
            uid, state = int(status["Uid"].split()[0]), status["State"].split()[0]
        except (OSError, KeyError, ValueError):
            continue
        if uid >= 200_000 and state != "Z":
            pids.append(int(entry))
    return pids
