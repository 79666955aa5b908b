"""kjax's test suite. TEST_XLA_FLAGS: the XLA:CPU flags every test process (conftest) and
every training subprocess the tests start use on top of their own device count.

Both flags cut compile time, which dominates the suite (the models are tiny): LLVM's
optimisation passes off (~30% off the suite), and XLA:CPU's older loop emitters in place of
its MLIR fusion emitters (the default tier went from 845 s to 462 s of pytest on a 2-core
Intel Xeon, 2026-12-07, same 1,873 tests). Neither enables fast-math; results keep their
meaning, and the tests compare against references, never against XLA's default pipeline.
"""

TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
