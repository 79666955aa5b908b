"""kjax.files.write_atomic: the new file or the old one after a crash, and the rename made
durable by an fsync of the folder after it (recorded through a monkeypatched os.fsync)."""

import os
import stat

import pytest

from kjax import files


def _record(monkeypatch):
    events = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(fd):
        st = os.fstat(fd)
        events.append(("fsync", stat.S_ISDIR(st.st_mode), st.st_ino))
        fsync(fd)

    def recording_replace(a, b):
        events.append(("replace", str(a), str(b)))
        replace(a, b)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    return events


@pytest.mark.skipif(os.name != "posix", reason="folders are fsynced on POSIX only")
@pytest.mark.parametrize("data", ["text\n", b"\x89PNG bytes"])
def test_write_atomic_fsyncs_the_file_then_renames_then_fsyncs_the_folder(
    tmp_path, monkeypatch, data
):
    path = tmp_path / "out.md"
    path.write_text("old")
    events = _record(monkeypatch)
    files.write_atomic(path, data)
    kinds = [e[0] for e in events]
    assert kinds == ["fsync", "replace", "fsync"], events
    assert events[0][1] is False  # the temporary file's data first
    assert events[1][2] == str(path)
    assert events[2][1:] == (True, tmp_path.stat().st_ino)  # then the folder, after
    got = path.read_bytes() if isinstance(data, bytes) else path.read_text()
    assert got == data
    assert [p.name for p in tmp_path.iterdir()] == ["out.md"]  # no temporary left


def test_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "out.md"
    path.write_text("old")

    def crash(fd):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk gone"):
        files.write_atomic(path, "new")
    assert path.read_text() == "old"
