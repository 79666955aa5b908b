"""kjax.rl.start_evals: a step-0 evaluation read back from another run's draw equals that
run's own draw, each run scores its own objective on it, and anything the draw reads (the
parameters, an evaluation setting, the salt) makes a miss that draws again."""

import dataclasses

import jax
import pytest

from kjax.rl import loop
from kjax.rl.components import build_components
from kjax.rl.config import Objective, ObjectiveConfig
from kjax.rl.start_evals import StartEvals
from tests.rl.tiny_run import TINY as _TINY

TINY = dataclasses.replace(_TINY, rl=dataclasses.replace(_TINY.rl, microbatches=1))  # B=8 on 8


def test_shared_start_evaluation_is_the_draw_and_misses_on_what_the_draw_reads(
    tmp_path, monkeypatch
):
    c, state = build_components(TINY, tmp_path / "run", log=lambda *a, **k: None)
    try:
        draws = []
        rollout = loop.rollout

        def counted(*args, **kwargs):
            draws.append(1)
            return rollout(*args, **kwargs)

        monkeypatch.setattr(loop, "rollout", counted)
        cache = StartEvals(tmp_path / "shared", salt="commit-a")
        plain = loop.evaluate(c, state.params)
        assert loop.evaluate(c, state.params, cache) == plain and len(draws) == 2
        assert len(list((tmp_path / "shared").glob("*.npz"))) == 1

        # Another arm of the seed: another objective and learning rate. Its evaluation is
        # read back (no draw) and equals its own draw, scored with its own objective.
        opt = dataclasses.replace(TINY.optimizer, learning_rate=7e-4)
        other = dataclasses.replace(c.cfg, objective=ObjectiveConfig(Objective.MEAN), optimizer=opt)
        arm = dataclasses.replace(c, cfg=other)
        own = loop.evaluate(arm, state.params)
        assert own["eval/objective"] != plain["eval/objective"]  # mean, not max@2
        before = len(draws)
        assert loop.evaluate(arm, state.params, cache) == own and len(draws) == before

        # Misses: a parameter moved by 1e-6, an evaluation setting, another salt; and a
        # torn file, drawn again and replaced.
        moved = jax.tree.map(lambda x: x, state.params)
        leaf = jax.tree.leaves(moved)[0]
        moved = jax.tree.map(lambda x: x + 1e-6 if x is leaf else x, moved)
        hotter = dataclasses.replace(c.cfg, eval=dataclasses.replace(c.cfg.eval, temperature=0.7))
        salted = StartEvals(tmp_path / "shared", salt="commit-b")
        hot = dataclasses.replace(c, cfg=hotter)
        for args in ((c, moved, cache), (hot, state.params, cache), (c, state.params, salted)):
            before = len(draws)
            loop.evaluate(*args)
            assert len(draws) == before + 1
        assert len(list((tmp_path / "shared").glob("*.npz"))) == 4
        key = cache.digest(c.cfg, state.params)
        (tmp_path / "shared" / f"{key}.npz").write_bytes(b"torn")
        before = len(draws)
        assert loop.evaluate(c, state.params, cache) == plain and len(draws) == before + 1
        assert loop.evaluate(c, state.params, cache) == plain and len(draws) == before + 1
    finally:
        c.close()


@pytest.mark.parametrize("field", ["name", "objective", "optimizer"])
def test_only_fields_no_draw_reads_are_left_out_of_the_digest(field, tmp_path):
    """The digest ignores exactly StartEvals.UPDATE_ONLY; a field the draw reads (steps
    stands in for any other) changes it."""
    cache, params = StartEvals(tmp_path), {"w": jax.numpy.ones((2, 2))}
    changed = {
        "name": dataclasses.replace(TINY, name="other"),
        "objective": dataclasses.replace(TINY, objective=ObjectiveConfig(Objective.MEAN)),
        "optimizer": dataclasses.replace(
            TINY, optimizer=dataclasses.replace(TINY.optimizer, learning_rate=1.0)
        ),
    }[field]
    assert cache.digest(changed, params) == cache.digest(TINY, params)
    assert cache.digest(dataclasses.replace(TINY, steps=13), params) != cache.digest(TINY, params)
