"""The table-7 rework (experiments/tables/smollm2_lora_passk.py) declares what it will run:
every arm's config (full and smoke budgets) validates, trains LoRA on SmolLM2, and each
claim compares two of its arms on a metric the table reports. Its runs are not in CI."""

from experiments.tables import smollm2_lora_passk as t
from kjax.rl.config import ModelKind, Objective


def test_arms_and_claims_are_declared_before_any_run():
    names = {arm.name for arm in t.TABLE.arms}
    for smoke in (False, True):
        for arm in t.TABLE.arms:
            cfg = arm.make(t.TABLE.base(0, smoke)).validate(1)
            if not smoke:
                assert cfg.model.kind is ModelKind.PRETRAINED and cfg.model.lora.rank == 16
                assert cfg.eval.n_eval >= 2 * t.K  # unbiased pass@8 with room to spare
                if cfg.objective.objective is Objective.MAX_AT_K:
                    assert cfg.objective.k == t.K
    metrics = {m for _, m in t.TABLE.columns}
    for claim in t.TABLE.claims:
        assert {claim.arm, claim.baseline} <= names and claim.metric in metrics
