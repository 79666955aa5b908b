#!/usr/bin/env bash
# GPU check: the `gpu` test tier, the sampler (SmolLM2 and Llama-3.2-1B shapes, bfloat16,
# tokens/s and % of the HBM roofline) and the update (RL-step breakdown, and the update's
# loss+grad on the reference vs shared-prompt path: tokens/s, MFU, peak memory) on one CUDA
# machine, < 10 minutes.
#   bash experiments/bench/gpu_check.sh OUTDIR
# Uses python3 (or $PYTHON), which must already have CUDA jax. Without network, missing
# dependencies install only from wheels placed in experiments/bench/wheels/ beside this script.
# Writes OUTDIR/{env,gpu_tests,bench_rl_step,sampler_smollm2,sampler_llama3_1b}.json
# (+ gpu_tests.xml, *.log); exits non-zero
# if any part failed.
set -uo pipefail
OUT=${1:?usage: bash experiments/bench/gpu_check.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
export TF_CPP_MIN_LOG_LEVEL=3 XLA_PYTHON_CLIENT_PREALLOCATE=false

if ! $PY -c "import kjax, flax, optax, orbax.checkpoint, tensorflow_datasets" 2>/dev/null; then
  $PY -m pip install -q --no-index --find-links experiments/bench/wheels -e . \
    || $PY -m pip install -q --no-deps -e . || echo "gpu_check: install failed" >&2
fi
$PY - > "$OUT/env.json" <<'PYEOF'
import json, jax
print(json.dumps({"jax": jax.__version__, "backend": jax.default_backend(),
                  "devices": [d.device_kind for d in jax.devices()]}))
PYEOF

status=0
# GPU test tier (conftest keeps the accelerator when KJAX_TEST_PLATFORM is set).
timeout 270 env KJAX_TEST_PLATFORM=cuda $PY -m pytest -m gpu -q -p no:cacheprovider \
  --junitxml="$OUT/gpu_tests.xml" > "$OUT/gpu_tests.log" 2>&1
rc=$?
echo "{\"pytest_gpu_exit_code\": $rc}" > "$OUT/gpu_tests.json"
[ "$rc" -eq 0 ] || status=1

# Sampler, bfloat16, 8x8 and 64x1 at S = T = 64 (tokens/s; % of the HBM roofline from the
# datasheet bandwidth of H100/H200, else measured). No transformers comparison here.
for model in smollm2 llama3_1b; do
  timeout 150 $PY -m experiments.bench.bench_sampler --model=$model --dtype=bfloat16 \
    --shapes=8x8,64x1 --repeats=3 --no-transformers --out="$OUT/sampler_$model.json" \
    > "$OUT/sampler_$model.log" 2>&1 || status=1
done

# RL-step breakdown, tokens/s and MFU (peak from the table for H100/H200), and the update's
# loss+grad, reference (prompt repeated, full logits) vs shared-prompt path, in bfloat16.
timeout 240 $PY -m experiments.bench.bench_rl_step --shapes=tiny_arith,smollm2 --steps=5 \
  --paths=tiny_arith,smollm2 --path_dtype=bfloat16 --path_repeats=5 \
  --out="$OUT/bench_rl_step.json" > "$OUT/bench_rl_step.log" 2>&1 || status=1
tail -n 8 "$OUT/gpu_tests.log" "$OUT/sampler_smollm2.log" "$OUT/sampler_llama3_1b.log" \
  "$OUT/bench_rl_step.log"
exit $status
