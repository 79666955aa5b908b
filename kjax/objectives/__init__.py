"""k-sample objectives: unbiased metrics and per-sample advantages, in pure jax.numpy.

Metrics (unbiased from N >= k samples, [B, N] -> [B]):
  pass_at_k, max_at_k, majority_at_k.
Advantages ([B, N] -> [B, N], under stop_gradient):
  mean_advantages (k = 1: RLOO, Dr.GRPO, GRPO, and SHRINKAGE: RLOO shrunk toward the
  other prompts of the batch), max_at_k_advantages (pass@k / max@k:
  PKPO, Tang et al., Chen et al., MaxPO's L2O), max_at_k_mixture_advantages (sum_k
  w_k max@k; MaxRL via maxrl_weights), majority_at_k_advantages (Tang et al.),
  max_at_k_offpolicy_advantages (Bagirov et al.: the weight of each sample's own ratio,
  exact or linearised, for S, LOO_MINUS_ONE and L2O), shrink_max_at_k_advantages (LOO,
  L2O, LOO_MINUS_ONE with the leave-one-out baseline shrunk toward the batch; Zeng et al.
  2025), maxrl_practical_advantages (MaxRL's per-group (r - mean) / mean of SkyRL and
  prime-rl; on binary rewards unbiased for MaxRL's J_{N-1}),
  shrink_max_at_k_mixture_advantages (a mixture over k, each k's baseline shrunk).
Label-free rewards: majority_pseudo_rewards (TTRL: agreement with the group's plurality
  answer) and pseudo_label_stats (how often that label is wrong).
Related objectives of the seed papers live in `related`. Every function has a slow
float64 subset-enumeration oracle in `reference` (same name, suffix `_ref`; the
off-policy one in `reference_offpolicy`).
`k` is always a static Python int. The math: docs/estimators.md.
"""

from kjax.objectives.advantages import (
    MaxAtKEstimator,
    MeanBaseline,
    max_at_k_advantages,
    maxrl_practical_advantages,
    mean_advantages,
)
from kjax.objectives.majority import majority_at_k, majority_at_k_advantages
from kjax.objectives.metrics import max_at_k, pass_at_k
from kjax.objectives.mixture import max_at_k_mixture_advantages, maxrl_weights
from kjax.objectives.offpolicy import max_at_k_offpolicy_advantages
from kjax.objectives.pseudo_label import majority_pseudo_rewards, pseudo_label_stats
from kjax.objectives.related import bon_aware_weight
from kjax.objectives.shrinkage import (
    shrink_max_at_k_advantages,
    shrink_max_at_k_mixture_advantages,
)

__all__ = [
    "MaxAtKEstimator",
    "bon_aware_weight",
    "MeanBaseline",
    "majority_at_k",
    "majority_at_k_advantages",
    "max_at_k",
    "max_at_k_advantages",
    "max_at_k_mixture_advantages",
    "max_at_k_offpolicy_advantages",
    "maxrl_practical_advantages",
    "maxrl_weights",
    "majority_pseudo_rewards",
    "mean_advantages",
    "pass_at_k",
    "pseudo_label_stats",
    "shrink_max_at_k_advantages",
    "shrink_max_at_k_mixture_advantages",
]
