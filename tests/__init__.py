"""kjax's test suite. TEST_XLA_FLAGS: the XLA:CPU flags every test process (conftest) and
every training subprocess the tests start use on top of their own device count."""

TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"
