"""Runs untrusted Python inside bubblewrap: read-only /usr, no home or project, private
tmp, no network, cleared env, own PID/user namespaces, rlimits and a wall timeout.

As root, the sandbox also drops to an unprivileged host uid, because the kernel exempts
root from RLIMIT_NPROC (the fork-bomb limit).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile

INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`)"
_SANDBOX_UID_BASE = 200_000  # host uids with no account: nothing on the host owns files
_SANDBOX_UID_SPAN = 50_000
_ACTIVE: set[int] = set()  # process groups of the sandboxes this process is running

# Trusted launcher, run inside the sandbox before the untrusted program: it sets the
# rlimits (they then bind the program and all its children) and runs the program.
_LAUNCHER = """\
import os, resource, sys
cpu, mem, fsize, nproc = (int(v) for v in sys.argv[1:5])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
del os, resource  # the program gets a fresh __main__; one interpreter start, not two
sys.argv = sys.argv[5:]
__import__("runpy").run_path(sys.argv[0], run_name="__main__")
"""


class Isolation(enum.Enum):
    BWRAP = "bwrap"  # the default; required for generated code
    # Explicit opt-out: rlimits and a timeout only. The program sees the host's files and
    # network, and as root the process limit does not bind. Trusted code only.
    UNSAFE_NONE = "unsafe_none"


class Status(enum.Enum):
    OK = "ok"  # exited 0
    FAILED = "failed"  # non-zero exit or killed by a signal (incl. CPU/memory/file limits)
    TIMEOUT = "timeout"  # wall-clock limit hit; the whole process group was killed


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """Limits for one sandboxed run (per test case)."""

    isolation: Isolation = Isolation.BWRAP
    memory_bytes: int = 1 << 30  # address space per process
    max_output_bytes: int = 1 << 20  # stdout/stderr and any file the program writes
    tmp_bytes: int = 16 << 20  # size of the private /tmp
    max_processes: int = 16  # per sandbox, counting bwrap's init and the program itself
    python: str = "/usr/bin/python3"  # a system interpreter: /usr is all the sandbox sees

    def __post_init__(self):
        for name in ("memory_bytes", "max_output_bytes", "tmp_bytes", "max_processes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxConfig.{name} must be > 0; got {getattr(self, name)}")


DEFAULT_SANDBOX = SandboxConfig()


@dataclasses.dataclass(frozen=True)
class RunResult:
    status: Status
    stdout: bytes
    stderr: bytes


class SandboxUnavailableError(RuntimeError):
    pass


def check_available(config: SandboxConfig) -> None:
    """Raises SandboxUnavailableError (naming the fix) unless untrusted code can run."""
    if not os.path.isfile(config.python):
        raise SandboxUnavailableError(
            f"sandbox interpreter {config.python} not found; install python3 under /usr "
            "(`apt-get install python3`) or set SandboxConfig.python to one under /usr."
        )
    if config.isolation is Isolation.BWRAP and shutil.which("bwrap") is None:
        raise SandboxUnavailableError(
            f"refusing to run generated code: bwrap not found. Please {INSTALL_HINT}. To run "
            "it without a sandbox anyway (trusted code only), pass "
            "SandboxConfig(isolation=Isolation.UNSAFE_NONE)."
        )


def _bwrap_argv(program_fd: int, info_fd: int, config: SandboxConfig) -> list[str]:
    argv = ["bwrap", "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib64", "sbin"):
        target = os.path.join("/", name)
        if os.path.islink(target):  # merged-/usr systems: /bin -> usr/bin
            argv += ["--symlink", os.readlink(target), target]
        elif os.path.isdir(target):
            argv += ["--ro-bind", target, target]
    return argv + [
        "--proc", "/proc", "--dev", "/dev",
        "--size", str(config.tmp_bytes), "--tmpfs", "/tmp",
        "--ro-bind-data", str(program_fd), "/sandbox/main.py",
        "--chdir", "/tmp", "--info-fd", str(info_fd),
        "--unshare-all", "--unshare-user", "--disable-userns",  # net, pid, ipc, uts, cgroup, user
        "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
        "--setenv", "LANG", "C.UTF-8",
    ]  # fmt: skip


def run_python(source: str, stdin: bytes, timeout_s: float, config: SandboxConfig) -> RunResult:
    """Runs `source` as a Python program with `stdin`; returns its status and output.

    Output beyond config.max_output_bytes kills the program (SIGXFSZ) and is cut.
    """
    check_available(config)
    cpu_s = max(1, int(timeout_s + 0.999))
    limits = [
        str(cpu_s),
        str(config.memory_bytes),
        str(config.max_output_bytes),
        str(config.max_processes),
    ]
    with (
        tempfile.TemporaryFile() as prog,
        tempfile.TemporaryFile() as inp,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
    ):
        prog.write(source.encode("utf-8", errors="replace"))
        inp.write(stdin)
        for f in (prog, inp):
            f.flush()
            f.seek(0)
        kwargs, info_r, info_w = {}, -1, -1
        if config.isolation is Isolation.BWRAP:
            info_r, info_w = os.pipe()  # bwrap reports the host pid of its namespace init
            launcher = [config.python, "-I", "-c", _LAUNCHER, *limits, "/sandbox/main.py"]
            argv, cwd = _bwrap_argv(prog.fileno(), info_w, config) + launcher, None
            if os.geteuid() == 0:
                uid = _SANDBOX_UID_BASE + os.getpid() % _SANDBOX_UID_SPAN
                kwargs = {"user": uid, "group": uid, "extra_groups": []}
        else:
            cwd = tempfile.mkdtemp(prefix="kjax-unsafe-")
            with open(os.path.join(cwd, "main.py"), "wb") as f:
                f.write(prog.read())
            argv = [config.python, "-I", "-c", _LAUNCHER, *limits, os.path.join(cwd, "main.py")]
        try:
            try:
                proc = subprocess.Popen(
                    argv, stdin=inp, stdout=out, stderr=err, cwd=cwd,
                    env={"PATH": "/usr/bin:/bin"}, start_new_session=True,
                    pass_fds=tuple(fd for fd in (prog.fileno(), info_w) if fd >= 0), **kwargs,
                )  # fmt: skip
            except BaseException:
                for fd in (info_r, info_w):
                    if fd >= 0:
                        os.close(fd)
                raise
            _ACTIVE.add(proc.pid)
            init = _namespace_init(info_r, info_w)
            try:
                # A pidfd wakes us the moment bwrap exits (Popen.wait polls with sleeps).
                with _PidFd(proc.pid) as fd:
                    exited = select.select([fd], [], [], timeout_s + 0.5)[0]  # + start-up
                status = (
                    Status.TIMEOUT
                    if not exited
                    else (Status.OK if proc.wait() == 0 else Status.FAILED)
                )
            finally:
                _kill_group(proc)
                _kill_namespace(init)
        finally:
            if cwd is not None:
                shutil.rmtree(cwd, ignore_errors=True)
        return RunResult(
            status,
            _read_capped(out, config.max_output_bytes),
            _read_capped(err, config.max_output_bytes),
        )


class _PidFd:
    def __init__(self, pid: int):
        self.fd = os.pidfd_open(pid)

    def __enter__(self) -> int:
        return self.fd

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


def kill_active() -> None:
    """Kills every sandbox this process is running (for a worker told to stop)."""
    for pgid in list(_ACTIVE):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_group(proc: subprocess.Popen) -> None:
    # bwrap leads its own process group; its death takes the PID namespace (and every
    # process in it) down via --die-with-parent.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    _ACTIVE.discard(proc.pid)


def _read_capped(f, limit: int) -> bytes:
    f.seek(0)
    return f.read(limit)


def _namespace_init(info_r: int, info_w: int) -> int | None:
    """A pidfd for the sandbox's PID-namespace init, read from bwrap's --info-fd.

    A pidfd cannot be fooled by pid reuse; None when bwrap failed before starting it.
    """
    if info_r < 0:
        return None
    os.close(info_w)
    with os.fdopen(info_r, "rb") as f:
        info = f.read()  # bwrap writes it once the namespace exists, then closes the fd
    try:
        return os.pidfd_open(int(json.loads(info)["child-pid"]))
    except (ValueError, KeyError, TypeError, ProcessLookupError):
        return None


def _kill_namespace(pidfd: int | None) -> None:
    """Kills the sandbox's namespace init and waits until it has died.

    Its death makes the kernel kill every process left in the namespace first, so nothing
    the program started outlives this call (bwrap's own exit does not wait for that).
    """
    if pidfd is None:
        return
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        select.select([pidfd], [], [], 5.0)  # readable once the process has terminated
    except ProcessLookupError:
        pass
    finally:
        os.close(pidfd)
