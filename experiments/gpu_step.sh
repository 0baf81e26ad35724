#!/usr/bin/env bash
# The author's step on one GPU, in one command (docs/gpu.md, The step's levers): bench.py's step
# variants, then the fastest variant of each model whose gradients pass, 30 steps of train.py on
# the author's key config with those keys (the steps as experiments/gpu_h100_30steps ran them).
#
# $ OUT=experiments/gpu_step bash experiments/gpu_step.sh    ~9.5 min on one H200
#
# Writes OUT/bench_step.json and .log (bench.py), OUT/30steps/<run> (summary.json, log.jsonl),
# OUT/30steps.md and .svg (the table) and OUT/30steps.log (train.py's console). BUDGET: bench.py's
# step_budget in seconds. On one H200 it chose train.py's defaults (docs/gpu.md). The runs train in
# RUNS/30steps/<run> (default out-gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
python bench.py --sections=step --step_budget="${BUDGET:-330}" --out_json="$OUT/bench_step.json" \
    2>&1 | tee "$OUT/bench_step.log"
for model in gpt aed; do
    # the fastest variant that passed, as train.py keys: --compile_mode, --micro_batch (sequences)
    flags=$(python - "$OUT/bench_step.json" "$model" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["step"]
        if r.get("model") == sys.argv[2] and r.get("grad_ok")]
if rows:
    r = min(rows, key=lambda r: r["ms_per_step"])
    mode = "default" if r["accumulation"] == "backward" else r["mode"]
    print(f"--compile_mode={mode} --micro_batch={800 // r['micro_batches']}")
PY
)
    run=$([ $model = gpt ] && echo baseline || echo aed_mse_possub)
    [ -n "$flags" ] || { echo "=== $model: no variant passed, $run not run"; continue; }
    echo "=== $run: $flags"
    FLAGS=$flags STEPS=30 WARMUP=7 DECAY=17111 RUNS=${RUNS:-out-gpu} RES="$OUT/30steps" \
        bash experiments/gpu_author_regime.sh "$run" 2>&1 | tee -a "$OUT/30steps.log" || true
done
