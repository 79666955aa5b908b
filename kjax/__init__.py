"""kjax: reinforcement learning for k-sample inference-time objectives, in JAX.

Models are deployed with k samples (pass@k, best-of-N, majority voting); kjax
optimizes those objectives directly with unbiased, low-variance estimators.

Axis glossary, used in every docstring and shape comment:

  B  prompts (groups) in a batch          S  prompt length (tokens)
  N  samples per prompt (the group axis)  T  completion length (tokens)
  V  vocabulary size                      D  model (embedding) dimension
  H  attention heads                      K  key/value heads

`k` (the inference budget of an objective) is always a static Python int, never
an axis. Rollout-derived arrays keep the group axis explicit as `[B, N, ...]`.
"""

__version__ = "0.1.0"
