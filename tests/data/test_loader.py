"""Random-access loading: seeded shuffling, host sharding, resumable positions."""

import numpy as np
import pytest

from kjax.data import loader


def test_epoch_permutation_is_seeded_and_complete():
    c = loader.LoaderConfig(batch_size=10, seed=1)
    a, b = loader.epoch_indices(100, 0, c), loader.epoch_indices(100, 0, c)
    assert a.tolist() == b.tolist() and sorted(a.tolist()) == list(range(100))
    assert a.tolist() != loader.epoch_indices(100, 1, c).tolist()  # a new order per epoch
    assert a.tolist() != loader.epoch_indices(100, 0, loader.LoaderConfig(10, seed=2)).tolist()
    unshuffled = loader.LoaderConfig(batch_size=10, shuffle=False)
    assert loader.epoch_indices(100, 0, unshuffled).tolist() == list(range(100))


def test_hosts_get_disjoint_equal_shards():
    size, hosts = 103, 4
    shards = [
        loader.epoch_indices(
            size, 2, loader.LoaderConfig(5, seed=7, shard_index=h, shard_count=hosts)
        )
        for h in range(hosts)
    ]
    # 103 // 4 = 25 per host, cut to whole batches of 5: 25.
    assert [len(s) for s in shards] == [25] * hosts
    flat = np.concatenate(shards)
    assert len(set(flat.tolist())) == len(flat)


def test_batches_resume_exactly_from_a_position():
    source = [{"x": np.int64(i), "s": f"row{i}".encode()} for i in range(12)]
    config = loader.LoaderConfig(batch_size=4, seed=3)
    full = list(loader.batches(source, config, num_epochs=2))
    assert len(full) == 6 and full[-1][0] == loader.Position(2, 0)
    assert isinstance(full[0][1][0]["x"], int) and full[0][1][0]["s"].startswith("row")
    resume_at = full[2][0]  # after 3 batches: epoch 1, batch 0
    resumed = list(loader.batches(source, config, start=resume_at, num_epochs=2))
    assert resumed == full[3:]
    epoch0 = sorted(ex["x"] for _, batch in full[:3] for ex in batch)
    assert epoch0 == list(range(12))


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="lower batch_size"):
        next(loader.batches([{"x": 1}] * 3, loader.LoaderConfig(batch_size=4)))
    with pytest.raises(ValueError, match="shard_index"):
        loader.LoaderConfig(batch_size=1, shard_index=2, shard_count=2)
