"""A run's first evaluation, shared by the runs that would draw it identically.

Arms of a table that differ only in what the update does (the objective, the optimizer's
learning rate) start from the same parameters and draw their step-0 evaluation with the
same key (kjax.rl.loop.eval_key: the seed's), so they write the same held-out verdicts;
table 7's pilot saw all 15 start metrics of its two arms at one seed come out equal. An
evaluation of SmolLM2 on 200 problems x 16 samples costs minutes on a CPU, once per run.

StartEvals keeps those verdicts in a folder, under a digest of everything the draw reads:
the parameters (every leaf's path, dtype, shape and bytes), the run's configuration
without the fields only the update reads (UPDATE_ONLY), and a salt the caller sets (the
experiment harness: a digest of its source and of jax's version, so code edited in any
way, committed or not, draws again; the commit alone missed a dirty tree). Each run
still computes its own metrics from the verdicts, so eval/objective is its own
objective's. Anything else that differs is a miss, so a hit only skips a draw that would
write the same verdicts. A folder that cannot be read back is drawn again and rewritten.
Single-process runs only: on several hosts no process holds every parameter, and the
draw runs as before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import pathlib
import zipfile
from collections.abc import Callable

import jax
import numpy as np

from kjax.files import write_atomic
from kjax.rewards.verdict import Verdicts
from kjax.rl.config_text import to_json

UPDATE_ONLY = ("name", "objective", "optimizer")  # TrainConfig fields no draw reads


@dataclasses.dataclass(frozen=True)
class StartEvals:
    """folder: where the verdicts are kept (one .npz per digest); salt: what else tells
    two draws apart that the configuration does not (the code's version)."""

    folder: pathlib.Path
    salt: str = ""

    def digest(self, cfg, params) -> str:
        """The key of a step-0 draw: salt, configuration without UPDATE_ONLY, parameters."""
        h = hashlib.sha256(self.salt.encode())
        ident = {k: v for k, v in to_json(cfg).items() if k not in UPDATE_ONLY}
        h.update(json.dumps(ident, sort_keys=True).encode())
        leaves, _ = jax.tree_util.tree_flatten_with_path(params)
        for path, leaf in leaves:
            a = np.ascontiguousarray(jax.device_get(leaf))
            h.update(f"{jax.tree_util.keystr(path)}:{a.dtype}:{a.shape};".encode())
            h.update(a.tobytes())
        return h.hexdigest()[:32]

    def verdicts(self, cfg, params, draw: Callable[[], Verdicts]) -> Verdicts:
        """The verdicts kept for (cfg, params), or draw()'s, kept for the next run."""
        if jax.process_count() > 1:
            return draw()
        path = pathlib.Path(self.folder) / f"{self.digest(cfg, params)}.npz"
        if path.exists():
            try:
                with np.load(path) as z:
                    return Verdicts(z["scores"], z["answer_ids"], z["target"])
            except (OSError, ValueError, KeyError, zipfile.BadZipFile):
                pass  # a torn or foreign file: draw again and replace it
        v = draw()
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        np.savez(buf, scores=v.scores, answer_ids=v.answer_ids, target=v.target)
        write_atomic(path, buf.getvalue())
        return v
