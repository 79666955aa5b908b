"""Verifiers: completions -> scores [B, N] in [0, 1] and answer-class ids [B, N] (see
verdict.py). Modules: arith, countdown, math (math-verify), code and humaneval (sandboxed,
see sandbox.py), and pool (parallel verification with per-item timeouts)."""
