"""The verifier output contract: scores [B, N], answer-class ids [B, N] and targets [B].

Answer classes are numbered per prompt. The reference answer's class is always 0, so
`target` is 0 for every prompt (also when no sample matches it); other classes get
1, 2, ... in order of first appearance; -1 means "no extractable answer".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

import numpy as np

NO_ANSWER = -1
REFERENCE_CLASS = 0

A = TypeVar("A")


@dataclasses.dataclass(frozen=True)
class Verdicts:
    """What every verifier returns for a batch.

    scores: [B, N] float32 in [0, 1] (binary or continuous reward).
    answer_ids: [B, N] int32; -1 = no extractable answer; equal ids = equivalent answers.
    target: [B] int32; the class id of the reference answer (always REFERENCE_CLASS).
    counts: what the verifier saw, tallied over the batch for the step metrics (e.g. code
    runs by outcome: {"timeout": 3, "crashed": 5}); empty for most verifiers.
    """

    scores: np.ndarray
    answer_ids: np.ndarray
    target: np.ndarray
    counts: dict = dataclasses.field(default_factory=dict, compare=False)

    def __post_init__(self):
        s, a, t = self.scores, self.answer_ids, self.target
        if s.ndim != 2 or s.shape != a.shape or t.shape != (s.shape[0],):
            raise ValueError(
                f"Verdicts need scores [B, N], answer_ids [B, N], target [B]; got shapes "
                f"{s.shape}, {a.shape}, {t.shape}."
            )
        if s.dtype != np.float32 or a.dtype != np.int32 or t.dtype != np.int32:
            raise ValueError(
                f"Verdicts dtypes must be float32/int32/int32; got {s.dtype}, {a.dtype}, {t.dtype}."
            )
        if s.size and (np.isnan(s).any() or s.min() < 0.0 or s.max() > 1.0):
            raise ValueError("Verdicts scores must lie in [0, 1].")


@dataclasses.dataclass(frozen=True)
class PromptVerdict:
    """One prompt's verdict: scores [N] and answer_ids [N]."""

    scores: Sequence[float]
    answer_ids: Sequence[int]


def stack(rows: Sequence[PromptVerdict], counts: dict | None = None) -> Verdicts:
    """Stacks B per-prompt verdicts (each with the same N) into a `Verdicts`."""
    if not rows:
        raise ValueError("stack() needs at least one prompt's verdict.")
    n = {len(r.scores) for r in rows} | {len(r.answer_ids) for r in rows}
    if len(n) != 1:
        raise ValueError(f"Every prompt must have the same number of samples N; got {n}.")
    return Verdicts(
        scores=np.asarray([r.scores for r in rows], np.float32).reshape(len(rows), -1),
        answer_ids=np.asarray([r.answer_ids for r in rows], np.int32).reshape(len(rows), -1),
        target=np.full((len(rows),), REFERENCE_CLASS, np.int32),
        counts=dict(counts or {}),
    )


class AnswerClasses(Generic[A]):
    """Assigns class ids to answers of one prompt under an equivalence relation.

    Hashable answers with equal keys share a class without calling `equivalent`, so the
    (possibly slow) relation runs once per distinct key and class representative.
    """

    def __init__(
        self, reference: A | None, equivalent: Callable[[A, A], bool], key: Callable[[A], Hashable]
    ):
        self._equivalent = equivalent
        self._key = key
        self._reps: list[A | None] = [reference]  # class 0 = the reference's class
        self._by_key: dict[Hashable, int] = {}
        if reference is not None:
            self._by_key[key(reference)] = REFERENCE_CLASS

    def id_of(self, answer: A | None) -> int:
        if answer is None:
            return NO_ANSWER
        k = self._key(answer)
        if k in self._by_key:
            return self._by_key[k]
        for i, rep in enumerate(self._reps):
            if rep is not None and self._equivalent(rep, answer):
                self._by_key[k] = i
                return i
        self._reps.append(answer)
        self._by_key[k] = len(self._reps) - 1
        return self._by_key[k]
