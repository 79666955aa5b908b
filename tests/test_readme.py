"""README promises: a front door (short, with contents), exactly two commands, CI runs the
second, and its example code runs."""

import pathlib
import re

import numpy as np

ROOT = pathlib.Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


# README is the front door; the detail lives one link away (docs/, experiments/results/).
README_MAX_BYTES = 15 * 1024


def test_readme_is_short_and_has_contents():
    size = len(README.encode())
    assert size <= README_MAX_BYTES, (
        f"README.md is {size} bytes, over {README_MAX_BYTES}: move detail to docs/ or shorten "
        "the findings wording (experiments/lab/findings.py, SHORT)"
    )
    contents = README.split("**Contents**")[1].split("\n\n")[0]
    headings = re.findall(r"^## (.+)$", README, flags=re.M)
    for heading in headings:  # every section is listed, by its GitHub anchor
        anchor = re.sub(r"[^\w -]", "", heading.lower()).replace(" ", "-")
        assert f"(#{anchor})" in contents, heading


def test_two_commands_and_ci_runs_the_test_command():
    section = README.split("## The two commands")[1].split("\n## ")[0]
    commands = re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)
    assert len(commands) == 2, commands
    assert all("\n" not in c for c in commands)
    assert commands[1] in (ROOT / ".ci" / "run").read_text()


def test_python_example_runs_and_prints_what_it_says():
    (code,) = re.findall(r"```python\n(.*?)\n```", README, flags=re.S)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102
    obj, jnp = scope["obj"], scope["jnp"]
    np.testing.assert_allclose(obj.max_at_k(scope["rewards"], k=2), [0.66], atol=1e-6)
    np.testing.assert_allclose(
        obj.max_at_k_advantages(scope["rewards"], k=2),
        [[0.006667, 0.06, 0.06, 0.18, 0.0, 0.113333]],
        atol=1e-6,
    )
    l2o = obj.max_at_k_advantages(scope["rewards"], k=2, estimator=obj.MaxAtKEstimator.L2O)
    np.testing.assert_allclose(l2o, [[-0.06, -0.02, -0.02, 0.12, -0.06, 0.04]], atol=1e-6)
    np.testing.assert_allclose(l2o.sum(), 0.0, atol=1e-6)  # "sums to 0"
    np.testing.assert_allclose(
        obj.majority_at_k(scope["answers"], jnp.array([0]), k=4), [0.404762], atol=1e-6
    )
