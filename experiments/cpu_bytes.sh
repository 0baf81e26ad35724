#!/usr/bin/env bash
# The claim where the models are language models: bytes as tokens, data-constrained, 5 seeds.
#
# config/bytes_aed_mse_possub.py (the key AED: MSE embedding loss x 8, positional subtraction,
# 2 + 2 blocks of width 128) against config/bytes_baseline.py (the GPT: 4 blocks of width 140,
# non-embedding parameters within 1%), both on the first 1M bytes of data/wikipedia_bytes for 6,000
# steps of 16 x 256 bytes (24.6 epochs) under the author's schedule (warm-up, then a flat lr), one
# thread each, two at a time. The pilot that chose this regime is in experiments/bytes_pilot.md.
#
# Endpoints, declared before the study's runs: train.py's whole-val loss (all of val.bin) of the
# last model (the author's measure) and of the best checkpoint (the lowest val estimate: the better
# powered); AED - GPT and each dropout arm against its own model, paired by seed, with 95% t
# intervals (report.py --compare). Beside them, the count-model floors of the same 1M bytes.
#
# Dropout: the GPT at 0.1 and at 0.2 first train at pilot seed 0 (not a study seed); the rate whose
# best checkpoint scores lower on all of val.bin is the dropout arm's, for both models.
#
# $ bash experiments/cpu_bytes.sh                 (from anywhere; resumable: run it again after a
#                                                  stop; ~17 h of a 2-core machine: the wall
#                                                  times of bytes.md and bytes_pilot.md, 37 min
#                                                  to 3 h a run, two at a time)
# $ REPORT_ONLY=1 bash experiments/cpu_bytes.sh   (only the tables and charts, from what is done)
#
# Runs train in out-bytes/<run> (checkpoints: not in git); what is committed goes to
# experiments/bytes_pilot/<run> and experiments/bytes/<run> (experiments/runs.sh says how).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRA=("$@")  # a smoke test's overrides, e.g. --train_steps=4 --est_interval=2
OUT=${OUT:-out-bytes}
OUT_NAME=out-bytes
PILOT=${PILOT:-experiments/bytes_pilot}
STUDY=${STUDY:-experiments/bytes}
ARGS=()
source experiments/runs.sh  # run, launch, finish: each run once, resumable, two at a time
SEEDS=(1337 2 3 4 5)
sfx() { [ "$1" = 1337 ] && echo "" || echo "_seed$1"; }
RUNS=()
for s in "${SEEDS[@]}"; do
    for r in baseline aed_mse_possub baseline_dropout aed_mse_possub_dropout; do
        RUNS+=("$r$(sfx "$s")")
    done
done
PILOT_RUNS=(baseline_1m baseline_500k baseline_dropout01 baseline_dropout02)

whole_best() {  # the best checkpoint's whole-val loss of a finished pilot run
    python -c 'import json, sys; print(json.load(open(sys.argv[1]))["whole_val_best"])' \
        "$PILOT/$1/summary.json"
}

dropout() {  # the dropout arm's rate: the better GPT at pilot seed 0 (empty until both are done)
    RES=$PILOT have baseline_dropout01 && RES=$PILOT have baseline_dropout02 || return 0
    python -c 'import sys; a, b = map(float, sys.argv[1:]); print(0.1 if a <= b else 0.2)' \
        "$(whole_best baseline_dropout01)" "$(whole_best baseline_dropout02)"
}

report() {  # the pilot's table and the study's, each with the floors of its 1M bytes
    local done=() r fl=()
    if [ -f "${STUDY}_floors.json" ]; then fl=(--floors="${STUDY}_floors.json"); fi
    for r in "${PILOT_RUNS[@]}"; do RES=$PILOT have "$r" && done+=("$PILOT/$r"); done
    if [ ${#done[@]} -gt 0 ]; then
        {
            echo "The byte-level pilot (experiments/cpu_bytes.sh): the regime, then the" \
                 "dropout rate"
            echo "at seed 0; ${#done[@]} of ${#PILOT_RUNS[@]} runs."
            echo
            python experiments/report.py "${done[@]}" ${fl[@]+"${fl[@]}"} --x=epochs \
                --svg="$PILOT.svg" --title="val loss, the byte-level pilot"
        } > "$PILOT.md.tmp"
        mv "$PILOT.md.tmp" "$PILOT.md"
    fi
    done=()
    for r in "${RUNS[@]}"; do RES=$STUDY have "$r" && done+=("$STUDY/$r"); done
    [ ${#done[@]} -gt 0 ] || return 0
    local pairs=() p
    for p in aed_mse_possub,baseline aed_mse_possub_dropout,baseline_dropout \
             baseline_dropout,baseline aed_mse_possub_dropout,aed_mse_possub; do
        if RES=$STUDY have "${p%,*}" && RES=$STUDY have "${p#*,}"; then pairs+=("$p"); fi
    done
    {
        echo "The byte-level study (experiments/cpu_bytes.sh): ${#done[@]} of ${#RUNS[@]} runs" \
             "finished; dropout $(dropout)."
        echo
        python experiments/report.py "${done[@]}" ${fl[@]+"${fl[@]}"} --x=epochs \
            --svg="$STUDY.svg" --title="val loss, bytes (${#done[@]} of ${#RUNS[@]} runs)" \
            ${pairs[@]+"--compare=$(IFS=';'; echo "${pairs[*]}")"}
    } > "$STUDY.md.tmp"
    mv "$STUDY.md.tmp" "$STUDY.md"
    local pair=()  # the key pair's chart, val and train: does either overfit?
    for r in "${done[@]}"; do
        case ${r##*/} in baseline|baseline_seed*|aed_mse_possub|aed_mse_possub_seed*) pair+=("$r");;
        esac
    done
    [ ${#pair[@]} -gt 0 ] || return 0
    python experiments/report.py "${pair[@]}" ${fl[@]+"${fl[@]}"} --x=epochs --train=True \
        --svg="${STUDY}_pair.svg" \
        --title="aed_mse_possub vs baseline, by seed: val (thick) and train (thin)" > /dev/null
}

echo "=== $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
if [ -n "${REPORT_ONLY:-}" ]; then
    report
    exit 0
fi
python prepare.py --tokenizer=bytes  # data/wikipedia_bytes (a second)
python experiments/floors.py config/bytes_baseline.py --json="${STUDY}_floors.json"
mkdir -p "$PILOT" "$STUDY"

# the pilot: the regime (config/bytes_*.py as they are, and half the bytes), then the dropout rate
RES=$PILOT launch baseline_1m bytes_baseline
RES=$PILOT launch baseline_500k bytes_baseline --train_tokens=500000 --train_steps=4000
RES=$PILOT launch baseline_dropout01 bytes_baseline --dropout_rate=0.1 --seed=0
RES=$PILOT launch baseline_dropout02 bytes_baseline --dropout_rate=0.2 --seed=0
# the study: seed by seed, so that what is finished is always a set of whole seeds; the dropout
# arm waits for the pilot's choice
for s in "${SEEDS[@]}"; do
    RES=$STUDY launch "baseline$(sfx "$s")" bytes_baseline --seed="$s"
    RES=$STUDY launch "aed_mse_possub$(sfx "$s")" bytes_aed_mse_possub --seed="$s"
    while [ -z "$(dropout)" ]; do
        [ -n "$(jobs -rp)" ] || { echo "=== the dropout pilot did not finish (see $OUT/)"; exit 1; }
        wait -n || true
        report
    done
    RES=$STUDY launch "baseline_dropout$(sfx "$s")" bytes_baseline --dropout_rate="$(dropout)" \
        --seed="$s"
    RES=$STUDY launch "aed_mse_possub_dropout$(sfx "$s")" bytes_aed_mse_possub \
        --dropout_rate="$(dropout)" --seed="$s"
done
RES=$STUDY finish
