"""Argument checks shared by the objectives: static (shape, dtype, k) so they run under jit."""

from __future__ import annotations

import numbers

import jax.numpy as jnp
import numpy as np

_KINDS = {
    "bool": (np.bool_,),
    "float": (np.floating,),
    "int": (np.integer,),
}


def check_group(x, name: str, kind: str) -> jnp.ndarray:
    """Returns `x` as an array after checking it is `[B, N]` of the given dtype kind.

    kind: "bool", "float" or "int". Raises ValueError naming `name` otherwise.
    """
    x = jnp.asarray(x)
    if x.ndim != 2:
        raise ValueError(
            f"`{name}` must have shape [B, N] (prompts, samples per prompt); got shape "
            f"{tuple(x.shape)}. Add a leading batch axis for a single group: x[None]."
        )
    if not any(jnp.issubdtype(x.dtype, t) for t in _KINDS[kind]):
        raise ValueError(f"`{name}` must have a {kind} dtype; got {x.dtype}.")
    if x.shape[1] < 1:
        raise ValueError(f"`{name}` has N = 0 samples per prompt; need N >= 1.")
    return x


def check_same_shape(a, a_name: str, b, b_name: str) -> None:
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(
            f"`{a_name}` and `{b_name}` must have the same shape; got {tuple(a.shape)} "
            f"and {tuple(b.shape)}."
        )


def check_k(k, n: int, *, name: str = "k", min_n: int | None = None) -> int:
    """Returns `k` as an int after checking 1 <= k <= n (k is static, never traced).

    min_n: the smallest N the estimator needs (e.g. k + 1 for leave-one-out); defaults
    to k. No unbiased estimate exists from fewer samples, so this raises instead of
    returning a silently wrong value.
    """
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise ValueError(
            f"`{name}` must be a static Python int; got {type(k).__name__} {k!r}. "
            "Pass it as a static argument under jit (static_argnames)."
        )
    k = int(k)
    if k < 1:
        raise ValueError(f"`{name}` must be >= 1; got {name}={k}.")
    need = k if min_n is None else min_n
    if n < need:
        raise ValueError(
            f"`{name}`={k} needs at least {need} samples per prompt but N={n}: no unbiased "
            f"estimate exists from fewer. Sample more per prompt (N >= {need}) or lower {name}."
        )
    return k


def check_weights(weights, n: int, min_n, name: str = "weights") -> tuple[tuple[int, float], ...]:
    """Returns a mixture's {k: w_k} as sorted ((k, w_k), ...) after checking every entry.

    Each k must be a static int with min_n(k) <= n (min_n: k -> the smallest N the
    per-k estimator needs); each w_k a finite float >= 0 (a negative weight would make
    the mixture reward a worse best-of-k). Raises ValueError naming k and N otherwise.
    """
    if not hasattr(weights, "items") or len(weights) == 0:
        raise ValueError(
            f"`{name}` must be a non-empty mapping {{k: w_k}}, e.g. maxrl_weights(4); "
            f"got {weights!r}."
        )
    out = []
    for k, w in weights.items():
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"`{name}` keys must be ints k >= 1; got k={k!r}.")
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not np.isfinite(w) or w < 0:
            raise ValueError(f"`{name}`[{k}] must be a finite float >= 0; got {w!r}.")
        need = min_n(int(k))
        if n < need:
            raise ValueError(
                f"`{name}` has k={k}, which needs at least {need} samples per prompt but "
                f"N={n}. Drop k={k} from `{name}` or sample N >= {need} per prompt."
            )
        out.append((int(k), float(w)))
    return tuple(sorted(out))
