"""BoN-aware weights (Chow et al.); self-certainty and Borda voting: tests/inference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kjax.objectives import related


@pytest.mark.parametrize("n", [1, 2, 8, 32])
def test_bon_weight_is_the_log_derivative_of_pass_at_n(n):
    def log_pass(log_q):  # log pass@N as a function of log success probability
        return jnp.log1p(-((1.0 - jnp.exp(log_q)) ** n))

    p = np.array([0.05, 0.3, 0.5, 0.9, 0.99])
    with jax.enable_x64(True):
        want = np.array([jax.grad(log_pass)(jnp.log(1.0 - pi)) for pi in p])
        got = related.bon_aware_weight(jnp.asarray(p), n)
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_bon_weight_float32_limits():
    p = jnp.array([0.0, 1e-7, 0.5, 1 - 1e-6, 1.0], jnp.float32)
    w = np.asarray(related.bon_aware_weight(p, 16))
    assert np.all(np.isfinite(w)) and np.all((w >= 0) & (w <= 1))
    assert w[0] == 0.0 and w[-1] == 1.0
    assert np.all(np.diff(w) >= 0)  # harder prompts weigh more
    np.testing.assert_allclose(w[3], 1.0, atol=1e-4)


def test_bad_inputs():
    with pytest.raises(ValueError, match="`n` must be"):
        related.bon_aware_weight(jnp.array([0.5]), 0)
