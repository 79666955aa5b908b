"""The hostile-program suite: each scores 0 within its timeout and the host is unaffected;
a correct program still scores 1. Expected outputs are chosen so that a leak would pass."""

import os
import socket
import time

import pytest

from kjax.rewards import code, humaneval
from tests.rewards.sandbox_env import require_bwrap, sandbox_processes

TIMEOUT_S = 1.5
SUM_TESTS = [("1 2\n", "3\n"), ("5 7\n", "12")]
CORRECT = "a, b = map(int, input().split())\nprint(a + b)\n"


@pytest.fixture(autouse=True)
def _bwrap_and_clean_host():
    require_bwrap()
    yield
    time.sleep(0.05)
    assert sandbox_processes() == [], "a sandboxed process outlived its run"


def timed_score(program, tests=SUM_TESTS):
    start = time.monotonic()
    result = code.score(program, tests, timeout_s=TIMEOUT_S)
    elapsed = time.monotonic() - start
    assert elapsed < len(tests) * (TIMEOUT_S + 2.0), f"took {elapsed:.1f}s"
    return result


def test_correct_program_scores_one_and_partial_scores_fraction():
    assert timed_score(CORRECT) == 1.0
    assert timed_score("print(3)") == 0.5  # passes the first test only
    assert timed_score("a, b = map(int, input().split())\nprint(f'  {a + b}  \\n\\n')") == 1.0


HOSTILE = {
    "infinite_loop": "while True:\n    pass\n",
    "sleep_forever": "import time\ntime.sleep(10**6)\nprint(3)\n",
    "fork_bomb": (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    ),
    "memory_bomb": "x = bytes(4 << 30)\n" + CORRECT,  # calloc: instant unless limited
    "memory_creep": "l = []\nwhile True:\n    l.append(bytearray(10**7))\n",
    "huge_output": CORRECT + "while True:\n    print('x' * 4096)\n",
    "exit_before_output": "import os\nos._exit(0)\n" + CORRECT,
    "kill_everything": "import os, signal\nos.kill(-1, signal.SIGKILL)\n" + CORRECT,
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program_scores_zero(name):
    assert timed_score(HOSTILE[name]) == 0.0


def test_huge_output_is_cut_off_by_the_file_size_limit():
    config = code.SandboxConfig(max_output_bytes=1 << 16)
    start = time.monotonic()
    result = code.run_python(HOSTILE["huge_output"], b"1 2\n", TIMEOUT_S, config)
    # Killed by SIGXFSZ at the cap, long before the wall timeout.
    assert result.status is code.Status.FAILED and time.monotonic() - start < TIMEOUT_S
    assert len(result.stdout) <= 1 << 16


def test_process_limit_bounds_forks():
    config = code.SandboxConfig(max_processes=8)
    program = (
        "import os, time\nn = 0\nfor _ in range(100):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(5)\n"
        "        os._exit(0)\n    n += 1\nprint(n, flush=True)\nos._exit(0)\n"
    )
    result = code.run_python(program, b"", TIMEOUT_S, config)
    # The program itself counts as one; bwrap's namespace init as another.
    assert result.status is code.Status.OK and 0 < int(result.stdout) < 8


def test_cannot_read_host_files_or_environment(tmp_path, monkeypatch):
    secret = "hunter2-" + os.urandom(4).hex()
    (tmp_path / "secret.txt").write_text(secret)
    monkeypatch.setenv("KJAX_TEST_SECRET", secret)
    paths = [
        str(tmp_path / "secret.txt"),
        os.path.abspath("setup.py"),
        os.path.expanduser("~/.bashrc"),
        "/etc/passwd",
    ]
    program = (
        "import os\nprint(os.environ.get('KJAX_TEST_SECRET', ''))\n"
        f"for p in {paths!r}:\n"
        "    try:\n        print(open(p).read())\n    except OSError:\n        pass\n"
        f"print(os.path.exists({os.getcwd()!r}), os.path.exists({os.path.expanduser('~')!r}))\n"
    )
    # A leak of the secret (env or file) would pass the test.
    assert timed_score(program, [("", secret)]) == 0.0
    out = code.run_python(program, b"", TIMEOUT_S, code.SandboxConfig()).stdout.decode()
    assert secret not in out and "kjax" not in out and out.split()[-2:] == ["False", "False"]


def test_cannot_write_outside_its_tmp(tmp_path):
    targets = [str(tmp_path / "pwned"), os.path.abspath("pwned_by_sandbox"), "/usr/pwned"]
    program = (
        f"for p in {targets!r}:\n"
        "    try:\n        open(p, 'w').write('x')\n        print('wrote', p)\n"
        "    except OSError:\n        pass\n"
        "open('/tmp/ok', 'w').write('fine')\nprint(open('/tmp/ok').read())\n"
    )
    assert timed_score(program, [("", "fine")]) == 1.0  # its private tmp works
    assert not any(os.path.exists(t) for t in targets)


def test_cannot_open_a_socket_to_the_host():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    program = (
        f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        "print('connected')\n"
    )
    try:
        assert timed_score(program, [("", "connected")]) == 0.0
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()


def test_cannot_kill_the_host_process():
    program = (
        f"import os, signal\ntry:\n    os.kill({os.getpid()}, signal.SIGKILL)\n"
        "    print('killed')\nexcept OSError:\n    pass\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
    )
    assert timed_score(program, [("", "killed")]) == 0.0  # and this test process lives


def test_overriding_builtins_cannot_fake_passing():
    test = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(2) == 3\n"
    fakes = [
        # an object equal to everything
        "def f(x):\n    class T:\n        __eq__ = lambda s, o: True\n    return T()\n",
        # a str subclass equal to everything
        "class S(int):\n    def __eq__(s, o):\n        return True\ndef f(x):\n    return S(0)\n",
        # builtins replaced, a forged result line, then exit before the harness reports
        "import builtins, os, sys\nbuiltins.AssertionError = ZeroDivisionError\n"
        "print('\\nPASS 0,1')\nsys.stdout.flush()\nos._exit(0)\n",
        # forge the harness's result line from a nonce-looking string in __main__
        "import __main__, os\nfor v in list(vars(__main__).values()):\n"
        "    if isinstance(v, str) and len(v) == 32:\n"
        "        print('\\n' + v + ' 0,1', flush=True)\n        os._exit(0)\n",
        # SystemExit from the candidate while asserts run
        "import sys\ndef f(x):\n    sys.exit(0)\n",
    ]
    for program in fakes:
        assert humaneval.score(program, test, "f", timeout_s=TIMEOUT_S) == 0.0, program
    assert humaneval.score("def f(x):\n    return x + 1\n", test, "f", timeout_s=TIMEOUT_S) == 1


def test_humaneval_partial_credit_per_assert():
    test = (
        "def check(candidate):\n    assert candidate(1) == 2\n    base = 3\n"
        "    for i in range(3):\n        assert candidate(i) == i + 1\n"
        "    assert candidate(base) == 5\n    assert abs(candidate(0.5) - 1.5) < 1e-9\n"
    )
    # Units: 1st assert, the loop, candidate(3) == 5 (wrong for x + 1), the float check.
    result = humaneval.check_program(
        "def f(x):\n    return x + 1\n", test, "f", timeout_s=TIMEOUT_S
    )
    assert result.passed == (True, True, False, True) and result.score == 0.75
    hang = "def f(x):\n    while x == 3:\n        pass\n    return x + 1\n"
    assert humaneval.score(hang, test, "f", timeout_s=TIMEOUT_S) == 0.0  # timeout fails all
