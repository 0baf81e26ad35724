#!/usr/bin/env bash
# How often the byte AED stalls: the overfitting study's first 400 steps (its slice, configs and
# schedule; the lr does not depend on train_steps, so these are the long runs' first 400 steps) at
# 40 new seeds (11-50), and as controls at seeds 11-30 the AED with embedding_loss_coeff=0 (same
# init and batches) and the GPT. One thread a run, two at a time.
#
# The rule, declared before the first run (experiments/README.md): a run stalls if its val
# estimate at step 400 is 3.0 or more. python experiments/stall.py --rate=experiments/bytes_stall
# gives each arm's rate with its exact (Clopper-Pearson) 95% interval.
#
# $ bash experiments/cpu_bytes_stall.sh                (resumable: run it again after a stop;
#                                                       about 4-5 h of a 2-core machine)
# $ REPORT_ONLY=1 bash experiments/cpu_bytes_stall.sh  (only the table)
#
# Runs train in out-bytes-stall/<run> (checkpoints: not in git); the committed copies go to
# experiments/bytes_stall/<run>.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRA=("$@")  # a smoke test's overrides, e.g. --train_steps=4 --est_interval=2
OUT=${OUT:-out-bytes-stall}
OUT_NAME=out-bytes-stall
RES=${RES:-experiments/bytes_stall}
ARGS=(--train_steps=400 --train_tokens=500000)
source experiments/runs.sh  # run, launch, finish: each run once, resumable, two at a time
RUNS=()
order=()  # in blocks of four, so that a partial table holds every arm
for i in $(seq 0 19); do
    a=$((11 + i)) b=$((31 + i))
    order+=("aed_seed$a bytes_aed_mse_possub --seed=$a"
            "aed_seed$b bytes_aed_mse_possub --seed=$b"
            "aed_coeff0_seed$a bytes_aed_mse_possub --seed=$a --embedding_loss_coeff=0.0"
            "gpt_seed$a bytes_baseline --seed=$a")
done
for r in "${order[@]}"; do RUNS+=("${r%% *}"); done

report() {
    {
        echo "How often the byte AED stalls (experiments/cpu_bytes_stall.sh): the rule, declared"
        echo "first, is a val estimate of 3.0 or more at step 400."
        echo
        python experiments/stall.py --rate="$RES" --of=${#RUNS[@]}
    } > "$RES.md.tmp"
    mv "$RES.md.tmp" "$RES.md"
}

echo "=== $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
mkdir -p "$RES"
if [ -n "${REPORT_ONLY:-}" ]; then
    report
    exit 0
fi
python prepare.py --tokenizer=bytes  # data/wikipedia_bytes (a second)
for r in "${order[@]}"; do
    # shellcheck disable=SC2086  # a run's name, config and arguments, split on spaces
    launch $r
done
finish
