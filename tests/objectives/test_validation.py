"""Invalid input raises a ValueError that names the argument; never a silent 1.0."""

import jax.numpy as jnp
import numpy as np
import pytest

from kjax import objectives as obj

E = obj.MaxAtKEstimator
R = jnp.asarray(np.linspace(0, 1, 8).reshape(2, 4), jnp.float32)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: obj.pass_at_k(R > 0.5, 5), "`k`=5 needs at least 5 samples .* N=4"),
        (lambda: obj.pass_at_k(R > 0.5, 0), "`k` must be >= 1"),
        (lambda: obj.pass_at_k(R > 0.5, 2.0), "`k` must be a static Python int"),
        (lambda: obj.pass_at_k(R > 0.5, True), "`k` must be a static Python int"),
        (lambda: obj.pass_at_k(R, 2), "`correct` must have a bool dtype"),
        (lambda: obj.pass_at_k((R > 0.5)[0], 2), r"`correct` must have shape \[B, N\]"),
        (lambda: obj.max_at_k(R > 0.5, 2), "`rewards` must have a float dtype"),
        (lambda: obj.max_at_k(R, 9), "`k`=9 needs at least 9"),
        (lambda: obj.max_at_k_advantages(R, 4, E.LOO), "`k`=4 needs at least 5"),
        (lambda: obj.max_at_k_advantages(R, 2, "loo"), "`estimator` must be a MaxAtKEstimator"),
        (lambda: obj.max_at_k_advantages(R, 2, E.CHEN_ANALYTIC), "must be binary"),
        (lambda: obj.mean_advantages(R[:, :1]), "RLOO"),
        (lambda: obj.mean_advantages(R, "rloo"), "`baseline` must be a MeanBaseline"),
    ],
)
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()
