#!/usr/bin/env bash
# The claim in its own regime: the byte pair where the GPT overfits, as in the author's runs.
#
# The byte configs (config/bytes_baseline.py, config/bytes_aed_mse_possub.py) on the first 700,000
# bytes of data/wikipedia_bytes for 5,600 steps of 16 x 256 bytes (32.8 epochs; the 1M-byte study,
# cpu_bytes.sh, saw 24.6 and neither model turned up), one thread each, two at a time.
#
# Endpoints, declared before the first run: train.py's whole-val loss (all of val.bin) of the last
# model (the author's measure) and of the best checkpoint (the lowest val estimate); AED - GPT
# paired by seed (1337, 2, 3, 4, 5), with 95% t intervals (report.py --compare). Beside them, the
# count-model floors of the same 700,000 bytes (experiments/floors.py, to order 8).
#
# The gate: first one GPT pilot at seed 0 (not a study seed). The key pair runs only if the pilot
# overfits: its best val estimate at least 1,000 steps before its last, and its last model at
# least 0.01 above its best on all of val.bin. If the 700,000-byte pilot fails, the one adjustment
# is fewer bytes: the first 500,000 for the same 5,600 steps (45.9 epochs), a second pilot with
# the same gate; if that fails too, the script stops and says so.
#
# Five new seeds (6-10), declared before they start in experiments/README.md (Five new seeds):
# the same slice, steps and configs; the pilots are not run again.
#
# $ bash experiments/cpu_bytes_overfit.sh                (resumable: run it again after a stop;
#                                                         about 7 h for five seeds on 2 cores)
# $ REPORT_ONLY=1 bash experiments/cpu_bytes_overfit.sh  (only the tables and charts)
#
# Runs train in out-bytes-overfit/<run> (checkpoints: not in git); the committed copies go to
# experiments/bytes_overfit_pilot/<run> and experiments/bytes_overfit/<run>.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRA=("$@")  # a smoke test's overrides, e.g. --train_steps=4 --est_interval=2
OUT=${OUT:-out-bytes-overfit}
OUT_NAME=out-bytes-overfit
PILOT=${PILOT:-experiments/bytes_overfit_pilot}
STUDY=${STUDY:-experiments/bytes_overfit}
STEPS=5600
ARGS=(--train_steps=$STEPS)
source experiments/runs.sh  # run, launch, finish: each run once, resumable, two at a time
SEEDS=(1337 2 3 4 5 6 7 8 9 10)
sfx() { [ "$1" = 1337 ] && echo "" || echo "_seed$1"; }
PILOT_RUNS=(baseline_700k baseline_500k)
RUNS=()
for s in "${SEEDS[@]}"; do RUNS+=("baseline$(sfx "$s")" "aed_mse_possub$(sfx "$s")"); done
floors() {  # a slice's floors, to order 8 (the 500,000-byte slice's were made for the 1M study)
    local f=experiments/bytes_$(( $1 / 1000 ))k_floors.json
    [ -f "$f" ] || f=experiments/bytes_pilot_$(( $1 / 1000 ))k_floors.json
    echo "$f"
}

overfits() {  # overfits <pilot run>: prints yes or no, and why, from its committed copy
    python - "$PILOT/$1" $STEPS <<'EOF'
import json, sys
run, steps = sys.argv[1], int(sys.argv[2])
s = json.load(open(f"{run}/summary.json"))
est = [json.loads(line) for line in open(f"{run}/log.jsonl") if '"type": "est"' in line]
best = min(est, key=lambda r: r["val"])["step"]
rise = s["whole_val_last"] - s["whole_val_best"]
ok = best <= s["train_steps"] - 1000 and rise >= 0.01
print("yes" if ok else "no", f"(best estimate at step {best:,} of {s['train_steps']:,}; whole val"
      f" {s['whole_val_last']:.4f} at the end, {s['whole_val_best']:.4f} at the best: {rise:+.4f})")
EOF
}

report() {  # the pilots' tables and the study's, each with the floors of its slice
    local done=() r fl=() n
    {
        echo "The overfitting pilots (experiments/cpu_bytes_overfit.sh): the GPT at seed 0, one"
        echo "table and chart (bytes_overfit_pilot_<slice>.svg) each, the floors of its slice."
        for r in "${PILOT_RUNS[@]}"; do
            RES=$PILOT have "$r" || continue
            n=${r#baseline_}
            fl=()
            [ -f "$(floors "${n%k}000")" ] && fl=(--floors="$(floors "${n%k}000")")
            printf '\n## The first %s bytes\n\n' "${n%k},000"
            python experiments/report.py "$PILOT/$r" ${fl[@]+"${fl[@]}"} --x=epochs --train=True \
                --svg="${PILOT}_$n.svg" --title="val (thick) and train, the ${n%k},000-byte pilot"
        done
    } > "$PILOT.md.tmp"
    mv "$PILOT.md.tmp" "$PILOT.md"
    done=() fl=()
    for r in ${RUNS[@]+"${RUNS[@]}"}; do RES=$STUDY have "$r" && done+=("$STUDY/$r"); done
    [ ${#done[@]} -gt 0 ] || return 0
    [ -f "$(floors "$TOKENS")" ] && fl=(--floors="$(floors "$TOKENS")")
    local cmp=()
    RES=$STUDY have aed_mse_possub && RES=$STUDY have baseline && \
        cmp=(--compare=aed_mse_possub,baseline)
    {
        echo "The byte pair where the GPT overfits (experiments/cpu_bytes_overfit.sh):" \
             "${#done[@]} of ${#RUNS[@]} runs finished."
        echo
        python experiments/report.py "${done[@]}" ${fl[@]+"${fl[@]}"} --x=epochs \
            ${cmp[@]+"${cmp[@]}"} --svg="$STUDY.svg" \
            --title="val loss, bytes where the GPT overfits (${#done[@]} of ${#RUNS[@]} runs)"
    } > "$STUDY.md.tmp"
    mv "$STUDY.md.tmp" "$STUDY.md"
    python experiments/report.py "${done[@]}" ${fl[@]+"${fl[@]}"} --x=epochs --train=True \
        --svg="${STUDY}_pair.svg" \
        --title="aed_mse_possub vs baseline, by seed: val (thick) and train (thin)" > /dev/null
    [ ${#done[@]} -eq ${#RUNS[@]} ] || return 0  # the declared analysis: once every seed is done
    {
        echo "The byte pair where the GPT overfits, its declared analysis (experiments/paired.py;"
        echo "the runs and the count-model floors: bytes_overfit.md; by step:" \
             "bytes_overfit_diff.svg)."
        echo
        python experiments/paired.py "$STUDY" --new=6,7,8,9,10 --svg="${STUDY}_diff.svg"
    } > "${STUDY}_paired.md.tmp"
    mv "${STUDY}_paired.md.tmp" "${STUDY}_paired.md"
}

pilot() {  # pilot <run> <bytes>: the GPT at seed 0 on the first <bytes> bytes; says yes or no
    RES=$PILOT run "$1" bytes_baseline --train_tokens="$2" --seed=0 >&2 || return 1
    report >&2
    overfits "$1"
}

echo "=== $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
TOKENS=700000
RES=$PILOT have baseline_500k && TOKENS=500000  # the one adjustment was made
if [ -n "${REPORT_ONLY:-}" ]; then
    report
    exit 0
fi
python prepare.py --tokenizer=bytes  # data/wikipedia_bytes (a second)
mkdir -p "$PILOT" "$STUDY"

verdict=$(pilot baseline_700k 700000) || { echo "=== the pilot did not finish"; exit 1; }
echo "=== the 700,000-byte pilot overfits: $verdict"
if [ "${verdict%% *}" != yes ]; then
    TOKENS=500000
    verdict=$(pilot baseline_500k $TOKENS) || { echo "=== the pilot did not finish"; exit 1; }
    echo "=== the 500,000-byte pilot overfits: $verdict"
    if [ "${verdict%% *}" != yes ]; then
        echo "=== neither pilot overfits by the gate: no study runs"; exit 1
    fi
fi
for s in "${SEEDS[@]}"; do  # seed by seed: what is finished is a set of whole seeds
    RES=$STUDY launch "baseline$(sfx "$s")" bytes_baseline --train_tokens=$TOKENS --seed="$s"
    RES=$STUDY launch "aed_mse_possub$(sfx "$s")" bytes_aed_mse_possub --train_tokens=$TOKENS \
        --seed="$s"
done
RES=$STUDY finish
