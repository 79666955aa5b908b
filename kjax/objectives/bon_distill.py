"""Best-of-n distillation (vBoN, Amini et al. 2024; BOND, Sessa et al. 2024) as a reward.

The best-of-n distribution. Draw n outputs from an anchor policy pi_ref and keep the one
with the highest reward r (ties broken uniformly at random among the tied best). With
R = r(Y), Y ~ pi_ref, write F(v) = P(R <= v) and F_(v) = P(R < v). The best of n has
reward v with probability F(v)^n - F_(v)^n, and given that reward it is any one output of
reward v in proportion to pi_ref, so

    pi_bon(y) = pi_ref(y) * w_n(y),   w_n = (F^n - F_^n) / (F - F_) = sum_{i=1..n} F^(i-1) F_^(n-i)

with F, F_ taken at r(y) (F - F_ = P(R = r(y)) > 0 on the support of pi_ref). With no
ties among outputs of different reward, F - F_ = pi_ref(y). For continuous rewards
F_ = F and w_n = n F^(n-1): the familiar pi_ref(y) n F(r(y))^(n-1). On a finite output
set that continuous form is not a distribution (it sums to more than 1); the exact form is.

The variational objective. For any g, max_pi E_pi[g(y)] - KL(pi || pi_ref) is attained
at pi* = pi_ref exp(g) / Z (the Gibbs variational principle; the value is log Z). With
g = log w_n - log n, Z = 1/n and pi* = pi_bon exactly, and the objective equals
-KL(pi || pi_bon) - log n: maximising it is minimising the backward KL to best-of-n,
which is vBoN. This module's transformed reward is that g,

    R = log(w_n / n) = (n - 1) log F + log((1 / n) sum_{j=0..n-1} t^j),   t = F_ / F,

which is exactly (n - 1) log F when the reward ties nothing (t = 1), i.e. vBoN's
E_pi[(n - 1) log F(r)] - KL(pi || pi_ref); vBoN's code writes the same objective divided
by n - 1 (reward log F, KL coefficient beta with n = 1 / beta + 1). In kjax the KL half is
the trainer's rl.kl_coef. The tie factor is in [1/n, 1]. Binary rewards, with p = 1 - q
the anchor's success rate: R = log((1 - q^n) / (n p)) for a correct sample (pass@n shared
among the correct outputs) and log(q^(n-1) / n) for a wrong one (best-of-n is wrong only
when all n are).

Sources: the papers' abstracts (their full text could not be read while this was written)
and vBoN's released code (github.com/rycolab/vbon: its README and sentiment example,
whose "exact" reward is (1/n) log(sum_i C(n, i) F_^(n-i) pi_ref(y)^i / pi_ref(y)), i.e.
log((F^n - F_^n) / pi_ref(y)) / n, this module's R up to scale and a constant). Everything
above is derived here and tested by exact enumeration in tests/objectives/test_bon_distill.py.

Estimating F. F and F_ are the empirical CDFs of anchor samples: with M anchor rewards
a_m, F_hat(r) = #{a_m <= r} / M and F_hat_(r) = #{a_m < r} / M (so ties with anchors
are split exactly as above, not at a mid-rank). A reward below every anchor has
F_hat = 0 and log 0 = -inf, so R is floored: R >= (n - 1) log(floor), with equality when
F_hat(r) <= floor. The default floor is half an anchor sample, 0.5 / M.

Two anchors:
  fixed (bon_log_cdf_rewards): the anchor rewards come from pi_ref, independent of the
    group. R is then a fixed function of r, and the score-function estimator is exactly
    unbiased for grad E_pi[R] (with M anchors, R uses the empirical F of those anchors).
    The trainer's ObjectiveConfig(BON_DISTILL, bon_anchor=REFERENCE, bon_anchor_samples=M)
    draws those anchors each step from the fixed KL reference (vBoN's objective).
  leave-one-out (bon_log_cdf_rewards_loo): sample i's anchors are the other N - 1
    samples of its own group, i.e. the current policy (BOND's moving anchor, with the
    anchor updated every step). See that function for what this costs.

Advantages (bon_distill_advantages) are in kjax's sum convention: per prompt,
sum_i A_i grad log pi(y_i) estimates grad E_pi[R], under stop_gradient. The math:
docs/estimators.md section 8.
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp

from kjax.objectives._validate import check_group
from kjax.objectives.advantages import MeanBaseline, mean_advantages


def _check_n(n) -> int:
    """n of best-of-n: a static int >= 2 (n = 1 is pi_ref itself, R = 0)."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise ValueError(
            f"`n` (best-of-n) must be a static Python int >= 2; got {type(n).__name__} {n!r}."
        )
    if n < 2:
        raise ValueError(
            f"`n` (best-of-n) must be >= 2; got n={n}. Best-of-1 is the anchor policy itself "
            "(the transformed reward is 0 for every sample): there is nothing to distil."
        )
    return int(n)


def _check_floor(floor, m: int) -> float:
    """The CDF floor: None -> half an anchor sample (0.5 / m); else a float in (0, 1)."""
    if floor is None:
        return 0.5 / m
    if not (isinstance(floor, numbers.Real) and not isinstance(floor, bool)):
        raise ValueError(f"`floor` must be a float in (0, 1) or None; got {floor!r}.")
    floor = float(floor)
    if not (math.isfinite(floor) and 0.0 < floor < 1.0):
        raise ValueError(
            f"`floor` must be in (0, 1): R = (n - 1) log(floor) is the transformed reward "
            f"of a sample below every anchor; got floor={floor!r}."
        )
    return floor


def _log_bon_weight(leq: jax.Array, less: jax.Array, m: int, n: int, floor: float) -> jax.Array:
    """log(w_n / n) from anchor counts, floored at (n - 1) log(floor).

    leq = #{anchors <= r}, less = #{anchors < r}, out of m anchors (float arrays). With
    F = leq / m floored at `floor` and d = 1 - t = (F - F_) / F in [0, 1], the tie factor
    (1/n) sum_{j<n} t^j is (1 - (1 - d)^n) / (n d) = -expm1(n log1p(-d)) / (n d): 1 at
    d = 0, 1/n at d = 1, with no cancellation as d -> 0.
    """
    f = jnp.maximum(leq / m, floor)
    d = jnp.clip((leq - less) / m / f, 0.0, 1.0)
    safe_d = jnp.where(d > 0, d, 1.0)
    tie = jnp.where(d > 0, -jnp.expm1(n * jnp.log1p(-safe_d)) / (n * safe_d), 1.0)
    r = (n - 1) * jnp.log(f) + jnp.log(tie)
    return jnp.maximum(r, (n - 1) * math.log(floor))


def bon_log_cdf_rewards(
    rewards: jax.Array, anchor_rewards: jax.Array, n: int, floor: float | None = None
) -> jax.Array:
    """The best-of-n transformed reward R = log(w_n / n) against fixed anchor samples.

    R = (n - 1) log F_hat(r_i) when r_i ties no anchor, with the exact tie factor otherwise
    (module docstring); floored at (n - 1) log(floor). Maximising E_pi[R] - KL(pi || pi_ref)
    has the best-of-n distribution of the anchors' empirical distribution as its optimum.

    Args:
      rewards: [B, N] float, the policy's samples.
      anchor_rewards: [B, M] float, rewards of M samples per prompt from the anchor policy
        pi_ref, independent of `rewards` (M may differ from N).
      n: static int >= 2, the n of best-of-n (it may exceed N and M).
      floor: the smallest CDF value trusted, in (0, 1); None: 0.5 / M.

    Returns:
      [B, N] float in the rewards' dtype, under stop_gradient, each >= (n - 1) log(floor)
      and <= 0; nondecreasing in the reward.
    """
    rewards = check_group(rewards, "rewards", "float")
    anchor_rewards = check_group(anchor_rewards, "anchor_rewards", "float")
    if anchor_rewards.shape[0] != rewards.shape[0]:
        raise ValueError(
            f"`anchor_rewards` must have the B={rewards.shape[0]} prompts of `rewards` on "
            f"axis 0 ([B, M]); got shape {tuple(anchor_rewards.shape)}."
        )
    n = _check_n(n)
    m = anchor_rewards.shape[1]
    floor = _check_floor(floor, m)
    dtype = rewards.dtype
    anchors = anchor_rewards.astype(dtype)[:, None, :]  # [B, 1, M]
    r = rewards[:, :, None]  # [B, N, 1]
    leq = jnp.sum(anchors <= r, axis=-1).astype(dtype)
    less = jnp.sum(anchors < r, axis=-1).astype(dtype)
    return jax.lax.stop_gradient(_log_bon_weight(leq, less, m, n, floor))


def _pairwise_counts(rewards: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[B, N, N] bool: below[b, i, j] = r_j < r_i, at_or_below[b, i, j] = r_j <= r_i (j != i)."""
    r_i, r_j = rewards[:, :, None], rewards[:, None, :]
    off_diagonal = ~jnp.eye(rewards.shape[1], dtype=bool)
    return r_j < r_i, (r_j <= r_i) & off_diagonal


def bon_log_cdf_rewards_loo(rewards: jax.Array, n: int, floor: float | None = None) -> jax.Array:
    """R_i = log(w_n / n) with the other N - 1 samples of the group as sample i's anchors.

    The trainer samples only from the current policy, so this is the anchor it has: the
    group without sample i (BOND's moving anchor, refreshed every step). R_i equals
    bon_log_cdf_rewards(r_i, r_without_i, n, floor). What the approximation costs:

    - The anchor is the current policy pi_t, not pi_ref: each step ascends towards the
      best-of-n of pi_t (a semi-gradient: F is held fixed while differentiating, as the
      gradient through F would make E_pi[R] nearly constant). With the trainer's KL to
      the warm start pi_0 at coefficient beta (rl.kl_coef, K2), the stationary points
      satisfy pi = pi_0 exp(R_pi / beta) / Z. For continuous rewards the best-of-m of
      pi_0 solves this with m = beta / (beta - (n - 1)) when beta > n - 1, with *exact*
      CDFs: beta = n would give best-of-n of the warm start; beta <= n - 1 has no such
      fixed point (the policy keeps sharpening towards the top reward), and beta = 1
      (vBoN's weight with a fixed anchor) is no longer the right coefficient. The trainer
      has M = N - 1 anchors and the floor instead, and converges elsewhere: at n = 8,
      N = 16, beta = 8 and the default floor, its expected update's stationary point
      (enumerated on 64 outputs with distinct rewards) is nearest best-of-3.3 of the warm
      start, mean reward 0.735 against best-of-8's 0.889; on binary rewards beta = n
      misses best-of-n even with exact CDFs (docs/estimators.md section 8, tested).
    - Finite anchors: E[R_i | y_i] = g_M(r_i) = E[log(w_n(F_hat, F_hat_) / n)] over
      M = N - 1 anchors, not log(w_n(F, F_) / n). By Jensen it is biased downwards; for a
      reward that ties nothing (F_hat = Binomial(M, F) / M) the bias is
      -(n - 1)(1 - F) / (2 M F) + O(1 / M^2): order 1/N where M F >> 1, and dominated by
      the floor where M F <~ 1 (the lowest samples of the group). g_M is still
      nondecreasing in r, so higher rewards always earn more.
    - The score-function estimator of bon_distill_advantages is exactly unbiased for
      grad E_pi[g_M(r)] with the anchor distribution held at pi_t (tested by enumeration).

    Args:
      rewards: [B, N] float with N >= 2.
      n: static int >= 2, the n of best-of-n.
      floor: in (0, 1); None: 0.5 / (N - 1), half an anchor sample.

    Returns:
      [B, N] float in the rewards' dtype, under stop_gradient.
    """
    rewards = check_group(rewards, "rewards", "float")
    n = _check_n(n)
    big_n = rewards.shape[1]
    if big_n < 2:
        raise ValueError(
            "`rewards` has N=1 sample per prompt; a leave-one-out anchor needs N >= 2 "
            "(the other samples of the group are the anchors)."
        )
    m = big_n - 1
    floor = _check_floor(floor, m)
    below, at_or_below = _pairwise_counts(rewards)
    dtype = rewards.dtype
    less = jnp.sum(below, axis=-1).astype(dtype)
    leq = jnp.sum(at_or_below, axis=-1).astype(dtype)
    return jax.lax.stop_gradient(_log_bon_weight(leq, less, m, n, floor))


def _leave_two_out(rewards: jax.Array, n: int, floor: float) -> jax.Array:
    """[B, j, i]: R_j^(-i), sample j's R with anchors all but {i, j} (diagonal unused).

    R_j with the group-without-j anchors (bon_log_cdf_rewards_loo) involves y_i, so the
    plain leave-one-out mean of those R_j would correlate with grad log pi(y_i) and bias
    the estimator. Removing i from j's anchors too (N - 2 of them) fixes that.
    """
    big_n = rewards.shape[1]
    below, at_or_below = _pairwise_counts(rewards)  # [b, j, i]: r_i vs r_j (j's anchors)
    dtype = rewards.dtype
    less = jnp.sum(below, axis=-1, keepdims=True) - below  # anchors of j other than i
    leq = jnp.sum(at_or_below, axis=-1, keepdims=True) - at_or_below
    return _log_bon_weight(leq.astype(dtype), less.astype(dtype), big_n - 2, n, floor)


def bon_distill_advantages(
    rewards: jax.Array,
    n: int,
    anchor_rewards: jax.Array | None = None,
    floor: float | None = None,
) -> jax.Array:
    """Advantages for best-of-n distillation: (R_i - b_i) / N, in the sum convention.

    Per prompt, sum_i A_i grad log pi(y_i) estimates grad E_pi[R] (the KL half of the
    objective is the trainer's penalty, rl.kl_coef; docs/estimators.md section 8).

    fixed anchor (anchor_rewards given): R = bon_log_cdf_rewards(rewards, anchor_rewards)
      and b_i = mean_{j != i} R_j (RLOO; N >= 2). Exactly unbiased for grad E_pi[R].
    leave-one-out anchor (anchor_rewards None): R = bon_log_cdf_rewards_loo(rewards) and
      b_i = mean_{j != i} R_j^(-i), where R_j^(-i) uses the N - 2 samples other than i and
      j as anchors, so b_i does not depend on y_i (N >= 3). Exactly unbiased for
      grad E_pi[g_{N-1}(r)] with the anchor held at the current policy (see
      bon_log_cdf_rewards_loo for what that objective is and costs).

    Args:
      rewards: [B, N] float.
      n: static int >= 2, the n of best-of-n.
      anchor_rewards: [B, M] float rewards of samples of the anchor policy, or None.
      floor: in (0, 1); None: half an anchor sample (0.5 / M, or 0.5 / (N - 1)).

    Returns:
      [B, N] float in the rewards' dtype, under stop_gradient. A group whose rewards are
      all equal gets exactly 0.
    """
    rewards = check_group(rewards, "rewards", "float")
    big_n = rewards.shape[1]
    if anchor_rewards is not None:
        r = bon_log_cdf_rewards(rewards, anchor_rewards, n, floor)
        if big_n < 2:
            raise ValueError("`rewards` has N=1 sample per prompt; the RLOO baseline needs N >= 2.")
        return mean_advantages(r, MeanBaseline.RLOO) / big_n
    n = _check_n(n)
    if big_n < 3:
        raise ValueError(
            f"`rewards` has N={big_n} samples per prompt; the leave-one-out anchor with its "
            "leave-two-out baseline needs N >= 3 (N - 2 >= 1 anchors for the baseline). "
            "Sample more per prompt or pass anchor_rewards."
        )
    floor = _check_floor(floor, big_n - 1)
    r = bon_log_cdf_rewards_loo(rewards, n, floor)
    pair = _leave_two_out(rewards, n, floor)  # [B, j, i]
    # mean_{j != i} (R_i - R_j^(-i)): differences first, so an all-equal group is exactly 0.
    off_diagonal = ~jnp.eye(big_n, dtype=bool)
    diff = jnp.where(off_diagonal, r[:, None, :] - pair, 0.0)
    return jax.lax.stop_gradient(jnp.sum(diff, axis=1) / ((big_n - 1) * big_n))
