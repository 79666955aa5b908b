"""The test environment itself: CPU platform with 8 fake devices for sharding tests."""

import jax


def test_eight_fake_cpu_devices():
    assert jax.default_backend() == "cpu"
    assert jax.device_count() == 8
