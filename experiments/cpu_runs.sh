#!/usr/bin/env bash
# The author's eight runs (docs/model.md, The author's runs) at CPU scale, plus a second seed of the
# key pair (aed_mse_possub vs baseline) and the two "next steps" runs (docs/model.md, Beyond the
# author), then the results table and chart (experiments/results.{md,svg}; the reading is in
# experiments/README.md).
#
# $ bash experiments/cpu_runs.sh          (from anywhere; 53 min for the first ten runs on an idle
#                                          2-core CPU VM, 93 min for all twelve on a slower day)
#
# Runs go to out-cpu-experiment/<run>, not to the configs' own out dirs, so a preset run by hand
# (python train.py config/cpu_baseline.py) never mixes with these. After an interruption the same
# command picks up where it stopped: finished runs are skipped, and an interrupted run resumes from
# its last checkpoint (train.py's resume is exact: the same weights as an uninterrupted run).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=out-cpu-experiment

echo "=== $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
    "python $(python -c \
    'import platform, torch; print(platform.python_version(), "torch", torch.__version__)')"
python prepare.py  # data/wikipedia/{train,val}.bin (a few seconds)
# the count-model floors of all of train.bin, scored as the runs' whole val (seconds)
python experiments/floors.py --context_size=128 --json=experiments/results_floors.json

run() {  # run <run name> <config name> [extra train.py args...]
    local out=$OUT/$1 config=config/$2.py
    shift 2
    if grep -qs '"status": "finished"' "$out/summary.json"; then
        echo "=== $out: already finished, skipped"
        return
    fi
    if [ -f "$out/ckpt_last.pt" ]; then
        set -- "$@" --init_from=resume
    elif [ -f "$out/log.jsonl" ]; then
        # killed before its first checkpoint: nothing to resume, start it over
        set -- "$@" --overwrite=True
    fi
    echo "=== $config $* -> $out  ($(date -u +%H:%M:%S))"
    python train.py "$config" "$@" --out_dir="$out" &
    pid=$!
    wait $pid
}
# a kill of this script (or Ctrl-C) stops the run in progress too, cleanly,
# instead of leaving it running
pid=
trap '[ -z "$pid" ] || { kill -TERM $pid 2>/dev/null; wait $pid; }; exit 130' INT TERM

start=$(date +%s)
run aed_cosine cpu_aed_cosine
run aed_mse cpu_aed_mse
run aed_plain cpu_aed_plain
run aed_possub cpu_aed_possub
run aed_mse_possub cpu_aed_mse_possub
run baseline cpu_baseline
run baseline_small cpu_baseline_small
run baseline_dropout cpu_baseline_dropout
# the key pair again with another seed: another init, other batches and other estimate batches
run aed_mse_possub_seed2 cpu_aed_mse_possub --seed=2
run baseline_seed2 cpu_baseline --seed=2
# the author's "next steps": positional subtraction on the GPT, and 3 encoder + 1 decoder blocks
run gpt_possub cpu_baseline --sub_pos_embed_to_decoder=YES_NO_LN
run aed_3enc_1dec cpu_aed_mse_possub --n_layer=3 --n_decoder_layer=1
echo "=== all runs done in $(( ($(date +%s) - start) / 60 )) min"

python experiments/report.py $OUT/aed_cosine $OUT/aed_mse $OUT/aed_plain $OUT/aed_possub \
    $OUT/aed_mse_possub $OUT/aed_mse_possub_seed2 $OUT/baseline $OUT/baseline_seed2 \
    $OUT/baseline_small $OUT/baseline_dropout $OUT/gpt_possub $OUT/aed_3enc_1dec \
    --compare=aed_mse_possub,baseline --floors=experiments/results_floors.json \
    --md=experiments/results.md --svg=experiments/results.svg
