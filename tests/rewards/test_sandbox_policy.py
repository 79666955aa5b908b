"""Without bwrap, generated code is refused unless the caller opts out explicitly."""

import shutil

import pytest

from kjax.rewards import code, sandbox

SUM = "a, b = map(int, input().split())\nprint(a + b)\n"


def test_refuses_without_bwrap_and_names_the_fix(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(sandbox.SandboxUnavailableError, match="apt-get install bubblewrap"):
        code.score(SUM, [("1 2", "3")], timeout_s=1.0)
    with pytest.raises(sandbox.SandboxUnavailableError, match="UNSAFE_NONE"):
        code.verify([[SUM]], [[("1 2", "3")]], timeout_s=1.0)


def test_explicit_opt_out_runs_with_limits_only(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    unsafe = sandbox.SandboxConfig(isolation=sandbox.Isolation.UNSAFE_NONE)
    assert code.score(SUM, [("1 2", "3"), ("2 2", "5")], timeout_s=2.0, config=unsafe) == 0.5
    loop = "while True:\n    pass\n"
    assert code.score(loop, [("", "")], timeout_s=0.5, config=unsafe) == 0.0


def test_missing_interpreter_is_a_clear_error():
    with pytest.raises(sandbox.SandboxUnavailableError, match="not found"):
        sandbox.check_available(sandbox.SandboxConfig(python="/usr/bin/no-such-python"))


def test_config_validation():
    with pytest.raises(ValueError, match="memory_bytes"):
        sandbox.SandboxConfig(memory_bytes=0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1 2\n3\n", ("1 2", "3")), ("  1   2 \n\n3  \n\n", ("1 2", "3")), (b"x\r\n", ("x",))],
)
def test_whitespace_normalization(text, expected):
    assert code.normalize_output(text) == expected


def test_extract_program_takes_last_fenced_block():
    completion = "Plan:\n```python\nprint(1)\n```\nFixed:\n```python\nprint(2)\n```\n"
    assert code.extract_program(completion) == "print(2)\n"
    assert code.extract_program("print(3)") == "print(3)"
