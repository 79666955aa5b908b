"""Completion lengths for the planner's real-token projection (plan_scale --lengths).

The static plan (kjax.scale.planner.Plan) runs every sample to the cap T: the update on
B x N x T completion slots, the sampler for T - 1 decode steps on all B x N rows. With a
distribution of completion lengths the planner projects what kjax runs instead: the
packed update (rl.pack=GROUP, kjax.rl.packing) at the rows R a step of those lengths
needs, and the compacting sampler (sampler_compact_floor, kjax.sampling) at the live
batch sizes its schedule would use. This module is the arithmetic (numpy only):

- `Lengths`: the distribution, parsed from a flag (`parse`): a mean fraction of T with a
  tail at the cap, a histogram, or a run's metrics.jsonl; `tokens` turns it into one
  step's [B, N] lengths (the distribution's quantiles, dealt to groups by a seeded
  shuffle: the same lengths for the same flag).
- `rows_needed`: first-fit decreasing of each group's spans, packing.plan's rule.
- `decode_schedule`: (rows, window, steps) of the decode loops for those lengths.
- `compacted_step` / `sampler_seconds`: a decode step's roofline terms at any live batch
  size and window, from the compiled ones.
- `real_forward_flops`: the model FLOPs of one forward on the real tokens only.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import numpy as np

from kjax.scale.costs import matmul_params

DEFAULT_TAIL = 0.05  # share of completions at the cap when the flag gives none
Terms = tuple[float, float, float]  # seconds: compute, HBM, ICI


@dataclasses.dataclass(frozen=True)
class Lengths:
    """Completion lengths as fractions of the cap T: a share `tail` at `top` (the longest,
    1.0 = the cap), the rest (the body) uniform on an interval with the remaining mean
    (`[0, 2 m]`, or `[2 m - top, top]` when that would pass `top`), or, with `bins`, a
    histogram: (upper edge, weight) pairs, uniform inside each bin (edges increasing, the
    first bin from 0). `prompt`: real prompt tokens per sample (None: the prompt width S)."""

    mean: float
    tail: float = DEFAULT_TAIL
    top: float = 1.0
    bins: tuple[tuple[float, float], ...] = ()
    prompt: float | None = None
    source: str = ""

    def quantile(self, q) -> np.ndarray:
        """Length fractions at probabilities q (array in [0, 1))."""
        q = np.asarray(q, float)
        body_share = 1.0 - self.tail
        qb = np.clip(q / body_share, 0.0, 1.0) if body_share > 0 else np.ones_like(q)
        if self.bins:
            edges = np.array([0.0] + [e for e, _ in self.bins])
            weights = np.array([w for _, w in self.bins], float)
            cdf = np.concatenate([[0.0], np.cumsum(weights / weights.sum())])
            body = np.interp(qb, cdf, edges)
        else:
            lo, hi = self.body_range()
            body = lo + qb * (hi - lo)
        return np.where(q >= body_share, self.top, body)

    def body_range(self) -> tuple[float, float]:
        """The uniform body's [lo, hi] (mean/tail form)."""
        if self.tail >= 1.0:
            return self.top, self.top
        m = (self.mean - self.tail * self.top) / (1.0 - self.tail)
        return (0.0, 2 * m) if 2 * m <= self.top else (2 * m - self.top, self.top)

    def tokens(self, B: int, N: int, T: int, seed: int = 0) -> np.ndarray:
        """[B, N] int lengths in [1, T]: the B*N quantiles at (i + 1/2) / (B N), rounded to
        tokens, dealt to the groups by a shuffle seeded with `seed`."""
        n = B * N
        frac = self.quantile((np.arange(n) + 0.5) / n)
        lengths = np.clip(np.rint(frac * T), 1, T).astype(np.int64)
        return np.random.default_rng(seed).permutation(lengths).reshape(B, N)

    def describe(self, T: int) -> str:
        shape = (
            "histogram " + ", ".join(f"<= {e:g}: {w:g}" for e, w in self.bins)
            if self.bins
            else "uniform body [{:.3f}, {:.3f}]".format(*self.body_range())
        )
        prompt = "" if self.prompt is None else f"; prompts {self.prompt:g} real tokens"
        return (
            f"mean {self.mean:.3f} of T = {self.mean * T:,.0f} tokens, {self.tail:.1%} at "
            f"{self.top:g} T, {shape}{prompt}" + (f" ({self.source})" if self.source else "")
        )


def _float(key: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"--lengths: {key}={value!r} is not a number") from None


def from_metrics(path: str) -> tuple[float, float]:
    """(mean fraction, longest fraction) of T from a run's metrics.jsonl: per step the
    trainer logs tokens/padding (1 - real / B N T) and tokens/sampler_padding (1 - real /
    B N longest), so the mean is 1 - padding and the longest (1 - padding) / (1 -
    sampler_padding); both averaged over the steps that log them."""
    file = pathlib.Path(path)
    if not file.is_file():
        raise ValueError(f"--lengths: no file {path!r}; give a run's metrics.jsonl or mean=F")
    means, tops = [], []
    for line in file.read_text().splitlines():
        row = json.loads(line) if line.strip() else {}
        if "tokens/padding" in row and "tokens/sampler_padding" in row:
            real = 1.0 - row["tokens/padding"]
            means.append(real)
            tops.append(min(1.0, real / max(1.0 - row["tokens/sampler_padding"], 1e-12)))
    if not means:
        raise ValueError(
            f"--lengths: {path} has no step with tokens/padding and tokens/sampler_padding "
            "(logged by kjax.rl.loop since issue 45); give mean=F[,tail=F] instead"
        )
    return float(np.mean(means)), float(np.mean(tops))


def parse(spec: str, T: int) -> Lengths:
    """A Lengths from the flag: comma-separated key=value, or a path to metrics.jsonl.

    mean=F (fraction of T) or mean_tokens=N; tail=F (share at the top, default 0.05);
    top=F (the longest, fraction of T, default 1); hist=E:W/E:W/... (bins: upper edge
    as a fraction of T, weight; replaces the uniform body); prompt=N (real prompt tokens
    per sample); file=PATH or a bare PATH (metrics.jsonl: mean and top from the run).
    """
    fields: dict[str, str] = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        key, eq, value = part.partition("=")
        if not eq:
            key, value = "file", part
        if key not in ("mean", "mean_tokens", "tail", "top", "hist", "prompt", "file"):
            raise ValueError(
                f"--lengths: unknown field {key!r}; use mean=F or mean_tokens=N, tail=F, "
                "top=F, hist=E:W/E:W, prompt=N, or a metrics.jsonl path"
            )
        fields[key] = value
    kw: dict = {}
    if "file" in fields:
        kw["mean"], kw["top"] = from_metrics(fields["file"])
        kw["source"] = f"from {pathlib.Path(fields['file']).name}"
    if "mean" in fields:
        kw["mean"] = _float("mean", fields["mean"])
    if "mean_tokens" in fields:
        kw["mean"] = _float("mean_tokens", fields["mean_tokens"]) / T
    for key in ("tail", "top", "prompt"):
        if key in fields:
            kw[key] = _float(key, fields[key])
    if "hist" in fields:
        bins = []
        for b in fields["hist"].split("/"):
            edge, colon, weight = b.partition(":")
            if not colon:
                raise ValueError(f"--lengths: hist bin {b!r} must be EDGE:WEIGHT")
            bins.append((_float("hist edge", edge), _float("hist weight", weight)))
        kw["bins"] = tuple(bins)
    return check(kw, T)


def check(kw: dict, T: int) -> Lengths:
    """Lengths(**kw) with each field checked; a ValueError names the field and the fix."""
    top, tail = kw.get("top", 1.0), kw.get("tail", DEFAULT_TAIL)
    if not 0 < top <= 1:
        raise ValueError(f"--lengths: top={top} must be in (0, 1] (a fraction of T={T})")
    if not 0 <= tail <= 1:
        raise ValueError(f"--lengths: tail={tail} must be in [0, 1] (a share of completions)")
    bins = kw.get("bins", ())
    if bins:
        edges = [e for e, _ in bins]
        weights = [w for _, w in bins]
        bad_edges = edges != sorted(edges) or edges[0] <= 0 or edges[-1] > top
        if bad_edges or min(weights) < 0 or sum(weights) <= 0:
            raise ValueError(
                f"--lengths: hist bins {bins} need increasing edges in (0, top={top}] and "
                "weights >= 0 with a positive sum"
            )
        weights = np.array([w for _, w in bins]) / sum(w for _, w in bins)
        mids = (np.array([0.0, *edges[:-1]]) + np.array(edges)) / 2
        kw["mean"] = tail * top + (1 - tail) * float(weights @ mids)
    if "mean" not in kw:
        raise ValueError("--lengths needs mean=F (fraction of T), mean_tokens=N, hist= or a file")
    mean = kw["mean"]
    if not tail * top <= mean <= top or mean <= 0:
        raise ValueError(
            f"--lengths: mean={mean:.4g} of T={T} must be in (tail x top, top] = "
            f"({tail * top:.4g}, {top:.4g}]; lower tail= or raise mean="
        )
    prompt = kw.get("prompt")
    if prompt is not None and prompt < 0:
        raise ValueError(f"--lengths: prompt={prompt} must be >= 0 tokens")
    return Lengths(**{"tail": tail, "top": top, **kw})


def group_rows(lengths: np.ndarray, T: int) -> np.ndarray:
    """[B] packed rows of T slots each group needs: first-fit decreasing of its spans
    (longest first, ties by index, each into the first row with room), the rule of
    kjax.rl.packing.plan."""
    out = []
    for group in np.asarray(lengths):
        fill: list[int] = []
        for span in sorted(group.tolist(), reverse=True):
            for i, f in enumerate(fill):
                if f + span <= T:
                    fill[i] += span
                    break
            else:
                fill.append(span)
        out.append(sum(f > 0 for f in fill))
    return np.array(out)


def rows_needed(lengths: np.ndarray, T: int) -> int:
    """The most packed rows any group needs (>= 1): kjax.rl.packing.rows_needed, which
    sizes the packed update's static R for the whole batch."""
    return max(1, int(group_rows(lengths, T).max()))


def packed_rows(needed: int, n: int) -> int:
    """The smallest of packing.buckets(n) (N/4, N/2, 3N/4, N rounded up) >= needed."""
    buckets = sorted({max(1, math.ceil(n * q / 4)) for q in range(1, 5)})
    return min(r for r in buckets if r >= needed)


def decode_schedule(lengths: np.ndarray, sizes: tuple[int, ...],
                    phases: list[tuple[int, int]]) -> list[tuple[int, int, int]]:  # fmt: skip
    """(rows, window, steps) of the decode loops for these lengths: steps 1 .. longest - 1
    (a sample of length l draws tokens 1 .. l - 1 there; step 0 is the prefill's), each on
    the smallest of `sizes` that holds the samples still live (sizes = (B N,): the static
    decode), in the sampling phase (own-K/V window, end step) it falls in. As
    kjax.sampling.decode_row_steps counts rows."""
    flat = np.sort(np.asarray(lengths).reshape(-1))
    out: dict[tuple[int, int], int] = {}
    start = 1
    for window, end in phases:
        for step in range(start, min(end, int(flat[-1]))):
            live = flat.size - int(np.searchsorted(flat, step, side="right"))
            rows = min(r for r in sizes if r >= live)
            out[rows, window] = out.get((rows, window), 0) + 1
        start = end
    return [(r, w, n) for (r, w), n in out.items()]


def compacted_step(
    r: int,
    window: int,
    *,
    full_rows: int,
    static: tuple[Terms, Terms],
    windows: tuple[int, int],
    compact: list[tuple[int, Terms]],
) -> Terms:
    """A decode step's (compute, HBM, ICI) seconds on r rows at own-K/V `window`.

    static: the compiled static decode (all full_rows rows) at the first and the last
    window (`windows`); compact: (rows, terms) of the compiled compacted decode (kjax.sampling's
    per-row form: each row its own copy of its prompt's K/V) at the last window. r ==
    full_rows: linear in the window between the two static steps (as Plan). Otherwise each
    term is linear in r through the two compiled compacted sizes nearest r (extrapolated
    from the end pair; with one, through it and the static last-window step), less the
    static step's per-row, per-slot window cost for the slots below the last window."""
    (first, last), (w1, w2) = static, windows
    if r == full_rows:
        f = 0.0 if w2 == w1 else (window - w1) / (w2 - w1)
        return tuple(a + f * (b - a) for a, b in zip(first, last, strict=True))
    if not compact:
        raise ValueError(f"a decode step on {r} of {full_rows} rows needs a compacted one")
    pts = sorted(compact)
    if len(pts) == 1:
        pts = [pts[0], (full_rows, last)]
    i = int(np.clip(np.searchsorted([p[0] for p in pts], r), 1, len(pts) - 1))
    (ra, ta), (rb, tb) = pts[i - 1], pts[i]
    at_last = [a + (r - ra) * (b - a) / (rb - ra) for a, b in zip(ta, tb, strict=True)]
    per_slot = [0.0 if w2 == w1 else (b - a) / (full_rows * (w2 - w1))
                for a, b in zip(first, last, strict=True)]  # fmt: skip
    slots = w2 - window
    return tuple(max(0.0, x - s * r * slots) for x, s in zip(at_last, per_slot, strict=True))


def sampler_seconds(prefill: Terms, schedule: list[tuple[int, int, int]], step,
                    serial: bool = False) -> float:  # fmt: skip
    """Prefill + every decode step of `schedule` ((rows, window, steps)); step(rows,
    window) -> Terms; each program at max(terms) (perfect overlap) or their sum (serial)."""
    pick = sum if serial else max
    return pick(prefill) + sum(n * pick(step(r, w)) for r, w, n in schedule)


def real_forward_flops(c, S: int, lengths: np.ndarray) -> float:
    """Model FLOPs of one forward on the real tokens of a step (kjax.scale.forward_flops
    with every completion at its own length l instead of T): 2 x matmul params x (B S +
    sum l), the head on the sum l completion positions, attention S x S per prompt and
    l x (S + l) per completion (the prompt counted at its width S)."""
    lengths = np.asarray(lengths, float)
    B = lengths.shape[0]
    total = float(lengths.sum())
    head = 2 * c.hidden_size * c.vocab_size * total
    attention = (
        4
        * c.num_heads
        * c.head_dim
        * c.num_layers
        * (B * S * S + float((lengths * (S + lengths)).sum()))
    )
    return 2 * matmul_params(c) * (B * S + total) + head + attention
