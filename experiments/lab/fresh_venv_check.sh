#!/usr/bin/env bash
# Rerun a table's headline arms from a fresh clone in a fresh venv installed from
# constraints.txt, at the learning rates a finished run of the table chose, and compare
# the rows and verdicts with that run (experiments.lab.compare).
#
#   bash experiments/lab/fresh_venv_check.sh TABLE RUN_DIR SEEDS "ARM,ARM,..."
#   e.g. bash experiments/lab/fresh_venv_check.sh tang2025_table runs/tang2025 10 \
#          "mean (RLOO) / PG,pass@k LOO N=k / PG,maj@k / PG"
#
# RUN_DIR holds TABLE.jsonl and TABLE.claims.json of the finished run (experiments/results
# for the committed rows). Prints the comparison; the fresh run stays in a temp dir (its
# path is printed). Bit-identical rows need the same CPU model as the finished run: XLA's
# CPU code differs by instruction set (AVX-512, AMX), and so does its rounding.
set -euo pipefail
table=$1; run=$(cd "$2" && pwd); seeds=$3; arms=$4
repo=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
git clone -q "$repo" "$tmp/kjax"
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q --no-compile -c "$tmp/kjax/constraints.txt" -e "$tmp/kjax"
cd "$tmp/kjax"
"$tmp/venv/bin/python" -m "experiments.tables.$table" --workdir="$tmp/run" --seeds="$seeds" \
  --arms="$arms" --learning_rates="$run/$table.claims.json" > "$tmp/run.log" 2>&1
"$tmp/venv/bin/python" -m experiments.lab.compare --table="$table" "$run/$table.jsonl" "$tmp/run/$table.jsonl"
echo "fresh run: $tmp/run ($(git -C "$tmp/kjax" rev-parse --short HEAD))"
