#!/usr/bin/env bash
# The claim in its own regime: data-constrained, many epochs, several seeds.
#
# The author's runs saw their 38.3M training tokens ~37 times and all of them overfit (train
# 2.94-3.17, val 3.38-3.42); cpu_runs.sh sees each token 0.66 times and nothing overfits. Here the
# same CPU models (config/cpu_*.py, ~5.3M parameters) train on the first TRAIN_TOKENS tokens of
# train.bin only, for STEPS steps of 8 x 128 tokens: STEPS * 1024 / TRAIN_TOKENS epochs. The
# estimates read 12 batches of val.bin (drawn by the seed); at the end train.py also scores the last
# and the best model on all of val.bin.
#
# Why these values. A short pilot (cpu_baseline on the first 100k and 250k tokens, stopped after 300
# steps) showed 100k overfitting within 3 epochs and 250k not yet; the baseline run of this script
# then confirmed the choice: its val loss is lowest at 8.2 epochs and ends 0.30 higher, with train
# loss 3.1 below val (experiments/README.md, Data-constrained, many epochs).
#   TRAIN_TOKENS=100000  the baseline overfits: train far below val (>= 0.3),
#                        and val passes its minimum and turns up well before the end
#   STEPS=2000           20.5 epochs (the author: ~37); the lr decays to min_lr at the last step, as
#                        in the CPU presets
#   EST_INTERVAL=100     21 estimates a run: enough points to see where val turns, for ~10% of the
#                        time
# The runs (RUNS below): the key pair with 3 seeds each, the author's other six once, the author's
# two "next steps" (positional subtraction on the GPT; 3 encoder + 1 decoder blocks), and the
# regularised study: the GPT with dropout 0.2 and the key AED config with dropout 0.2 or with an
# embedding loss that cannot collapse (embedding_ln_affine=False), 3 seeds each; then the confounds
# (flat lr, a matched GPT, dropout 0.1, the loss at coefficient 1, the deep pair), 3 seeds each.
# Two at a time with one thread each (JOBS=2): one thread makes a run's numbers independent of the
# machine's core count and load, and two jobs keep both cores busy. On idle 2-core AMD EPYC VMs:
# 0.80-1.2 s a step for each of two runs side by side, 32-45 min a run; on a machine that is also
# busy with other work, 2-3 times that.
#
# $ bash experiments/cpu_data_constrained.sh   (from anywhere; resumable: run it again after a stop)
# $ REPORT_ONLY=1 bash experiments/cpu_data_constrained.sh   (only the tables and charts, from what
#                                                              is finished)
#
# Each run trains in out-cpu-dc/<run> (checkpoints: not in git; its output in out-cpu-dc/<run>.log).
# When it finishes, its summary.json and log.jsonl (estimates, the start/resume records and the last
# step: not every step) are copied to experiments/data_constrained/<run>/, which is committed; a run
# found there is skipped, so the experiment continues on another machine from what is in git. An
# interrupted run resumes from its last checkpoint when out-cpu-dc/<run> still exists (train.py's
# resume is exact). After every run the tables and charts are rewritten from the finished runs, with
# how many of all the runs that is.
set -euo pipefail
cd "$(dirname "$0")/.."
# a smoke test may override these from the environment, and add train.py flags on the command line:
# $ OUT=/tmp/o RES=/tmp/r STEPS=4 EST_INTERVAL=2 bash experiments/cpu_data_constrained.sh \
#       --warmup_iters=1
EXTRA=("$@")
OUT=${OUT:-out-cpu-dc}
RES=${RES:-experiments/data_constrained}
TRAIN_TOKENS=${TRAIN_TOKENS:-100000}
STEPS=${STEPS:-2000}
EST_INTERVAL=${EST_INTERVAL:-100}
OUT_NAME=out-cpu-dc
ARGS=(--train_tokens="$TRAIN_TOKENS" --train_steps="$STEPS" --lr_decay_iters="$STEPS"
      --est_interval="$EST_INTERVAL" --log_interval=100)
source experiments/runs.sh  # run, launch, finish: each run once, resumable, two at a time
RUNS=(
    baseline aed_mse_possub baseline_seed2 aed_mse_possub_seed2 baseline_seed3 aed_mse_possub_seed3
    aed_mse aed_plain aed_possub aed_cosine baseline_small baseline_dropout gpt_possub aed_3enc_1dec
    baseline_dropout_seed2 baseline_dropout_seed3
    aed_mse_possub_rerun
    aed_mse_possub_noaffine aed_mse_possub_noaffine_seed2 aed_mse_possub_noaffine_seed3
    aed_mse_possub_dropout aed_mse_possub_dropout_seed2 aed_mse_possub_dropout_seed3
    baseline_flat aed_mse_possub_flat baseline_dropout_flat baseline_matched
    baseline_dropout01 aed_mse_possub_dropout01 aed_mse_possub_noaffine_coeff1
    aed_deep baseline_deep
    baseline_flat_seed2 aed_mse_possub_flat_seed2 baseline_dropout_flat_seed2 baseline_matched_seed2
    baseline_dropout01_seed2 aed_mse_possub_dropout01_seed2 aed_mse_possub_noaffine_coeff1_seed2
    aed_deep_seed2 baseline_deep_seed2
    baseline_flat_seed3 aed_mse_possub_flat_seed3 baseline_dropout_flat_seed3 baseline_matched_seed3
    baseline_dropout01_seed3 aed_mse_possub_dropout01_seed3 aed_mse_possub_noaffine_coeff1_seed3
    aed_deep_seed3 baseline_deep_seed3
)
# (launched in another order, below)

echo "=== $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
    "python $(python -c \
    'import platform, torch; print(platform.python_version(), "torch", torch.__version__)')"
if [ -z "${REPORT_ONLY:-}" ]; then
    python prepare.py  # data/wikipedia/{train,val}.bin (a few seconds)
    # the count-model floors of the same tokens, scored as the runs' whole val (seconds)
    python experiments/floors.py --train_tokens="$TRAIN_TOKENS" --context_size=128 --max_order=4 \
        --json="${RES}_floors.json"
fi
mkdir -p "$RES"

report() {  # tables and charts over the runs finished so far, with the count-model floors
    local fl=()
    if [ -f "${RES}_floors.json" ]; then fl=(--floors="${RES}_floors.json"); fi
    local done=() r
    for r in "${RUNS[@]}"; do
        if grep -qs '"status": "finished"' "$RES/$r/summary.json"; then done+=("$RES/$r"); fi
    done
    [ ${#done[@]} -gt 0 ] || return 0
    local pair=() compare=()
    for r in baseline baseline_seed2 baseline_seed3 aed_mse_possub aed_mse_possub_seed2 \
             aed_mse_possub_seed3; do
        if [ -d "$RES/$r" ] && grep -qs '"status": "finished"' "$RES/$r/summary.json"; then
            pair+=("$RES/$r")
        fi
    done
    if [ -f "$RES/baseline/summary.json" ] && [ -f "$RES/aed_mse_possub/summary.json" ]; then
        compare=(--compare=aed_mse_possub,baseline)
    fi
    {
        echo "Data-constrained CPU runs (experiments/cpu_data_constrained.sh):" \
             "${#done[@]} of ${#RUNS[@]} runs finished;"
        echo "$TRAIN_TOKENS training tokens, $STEPS steps of 8 x 128 tokens," \
             "estimates every $EST_INTERVAL steps."
        echo
        python experiments/report.py "${done[@]}" "${compare[@]}" ${fl[@]+"${fl[@]}"} \
            --svg="$RES.svg" --x=epochs \
            --title="val loss, $TRAIN_TOKENS training tokens (${#done[@]} of ${#RUNS[@]} runs)"
    } > "$RES.md.tmp"
    mv "$RES.md.tmp" "$RES.md"
    # the regularised study: dropout and the embedding loss, against the key pair, paired by seed
    local reg=() pairs=()
    for r in baseline baseline_seed2 baseline_seed3 aed_mse_possub aed_mse_possub_seed2 \
             aed_mse_possub_seed3 \
             baseline_dropout baseline_dropout_seed2 baseline_dropout_seed3 aed_mse_possub_dropout \
             aed_mse_possub_dropout_seed2 aed_mse_possub_dropout_seed3 aed_mse_possub_noaffine \
             aed_mse_possub_noaffine_seed2 aed_mse_possub_noaffine_seed3 aed_mse_possub_rerun; do
        if have "$r"; then reg+=("$RES/$r"); fi
    done
    for p in aed_mse_possub_dropout,baseline_dropout baseline_dropout,baseline \
             aed_mse_possub,baseline_dropout \
             aed_mse_possub_dropout,aed_mse_possub \
             aed_mse_possub_noaffine,aed_mse_possub aed_mse_possub_noaffine,baseline \
             aed_mse_possub_rerun,aed_mse_possub; do
        if have "${p%,*}" && have "${p#*,}"; then pairs+=("$p"); fi
    done
    if have baseline_dropout_seed2 || have aed_mse_possub_rerun || have aed_mse_possub_noaffine ||
        have aed_mse_possub_dropout; then
        {
            echo "The regularised study (experiments/cpu_data_constrained.sh): dropout 0.2 and an" \
                 "embedding loss that"
            echo "cannot collapse (embedding_ln_affine=False), against the key pair;" \
                 "${#reg[@]} runs finished."
            echo
            python experiments/report.py "${reg[@]}" --diag=True ${fl[@]+"${fl[@]}"} --x=epochs \
                --svg="${RES}_regularised.svg" \
                ${pairs[@]+"--compare=$(IFS=';'; echo "${pairs[*]}")"} \
                --title="val loss, regularised runs and the key pair (${#reg[@]} runs)"
        } > "${RES}_regularised.md.tmp"
        mv "${RES}_regularised.md.tmp" "${RES}_regularised.md"
    fi
    # the confounds and the first objections, paired by seed with what each changes
    local conf=() cpairs=()
    for r in "${RUNS[@]:23}" baseline baseline_seed2 baseline_seed3 aed_mse_possub \
             aed_mse_possub_seed2 \
             aed_mse_possub_seed3 baseline_dropout baseline_dropout_seed2 baseline_dropout_seed3; do
        if have "$r"; then conf+=("$RES/$r"); fi
    done
    for p in aed_mse_possub_flat,baseline_flat aed_mse_possub_flat,baseline_dropout_flat \
             baseline_flat,baseline \
             aed_mse_possub_flat,aed_mse_possub baseline_dropout_flat,baseline_dropout \
             aed_mse_possub,baseline_matched baseline_matched,baseline \
             aed_mse_possub_dropout01,baseline_dropout01 baseline_dropout01,baseline \
             aed_mse_possub_dropout01,aed_mse_possub aed_mse_possub_noaffine_coeff1,aed_mse_possub \
             aed_mse_possub_noaffine_coeff1,baseline aed_deep,baseline_deep; do
        if have "${p%,*}" && have "${p#*,}"; then cpairs+=("$p"); fi
    done
    # post hoc: the AED-GPT pairs that share no run (dropout 0.2, where the AED underfits, aside)
    # pooled, seed pairs as one sample
    if have aed_deep_seed3 && have baseline_deep_seed3 && have aed_mse_possub_flat_seed3 &&
        have baseline_flat_seed3 && have aed_mse_possub_dropout01_seed3 &&
        have baseline_dropout01_seed3; then
        p=aed_mse_possub,baseline+aed_mse_possub_flat,baseline_flat+aed_deep,baseline_deep
        cpairs+=("$p+aed_mse_possub_dropout01,baseline_dropout01")
    fi
    if [ ${#cpairs[@]} -gt 0 ]; then
        {
            echo "The confounds and the first objections (experiments/cpu_data_constrained.sh):" \
                 "the author's"
            echo "flat lr, a GPT with the AED's non-embedding parameters, dropout 0.1," \
                 "the non-collapsing loss"
            echo "at coefficient 1, and the author's shape; ${#conf[@]} runs here."
            echo
            python experiments/report.py "${conf[@]}" --x=epochs ${fl[@]+"${fl[@]}"} \
                --svg="${RES}_confounds.svg" \
                "--compare=$(IFS=';'; echo "${cpairs[*]}")" \
                --title="val loss, the confounds and objections (${#conf[@]} runs)"
        } > "${RES}_confounds.md.tmp"
        mv "${RES}_confounds.md.tmp" "${RES}_confounds.md"
    fi
    if [ ${#pair[@]} -gt 0 ]; then
        python experiments/report.py "${pair[@]}" --svg="${RES}_pair.svg" --x=epochs --train=True \
            --title="aed_mse_possub vs baseline: val (solid) and train (dashed)" > /dev/null
    fi
}

# REPORT_ONLY=1: rewrite the tables and charts from the finished runs, no training
if [ -n "${REPORT_ONLY:-}" ]; then
    report
    exit 0
fi
launch baseline cpu_baseline
launch aed_mse_possub cpu_aed_mse_possub
launch baseline_seed2 cpu_baseline --seed=2
launch aed_mse_possub_seed2 cpu_aed_mse_possub --seed=2
launch baseline_seed3 cpu_baseline --seed=3
launch aed_mse_possub_seed3 cpu_aed_mse_possub --seed=3
launch aed_mse cpu_aed_mse
# the author's "next steps": positional subtraction on the GPT, and 3 encoder + 1 decoder blocks
launch gpt_possub cpu_baseline --sub_pos_embed_to_decoder=YES_NO_LN
launch aed_3enc_1dec cpu_aed_mse_possub --n_layer=3 --n_decoder_layer=1
launch aed_plain cpu_aed_plain
launch aed_possub cpu_aed_possub
launch aed_cosine cpu_aed_cosine
launch baseline_small cpu_baseline_small
launch baseline_dropout cpu_baseline_dropout
# regularised: the GPT with dropout 0.2 (the lowest single run above) against the key AED config
# with it
launch baseline_dropout_seed2 cpu_baseline_dropout --seed=2
launch baseline_dropout_seed3 cpu_baseline_dropout --seed=3
# the embedding loss: the key config again (train.py now logs the loss's diagnostics at every
# estimate), and with loss LayerNorms that have no learned weight and bias, so that the loss cannot
# collapse through them
launch aed_mse_possub_rerun cpu_aed_mse_possub
launch aed_mse_possub_noaffine cpu_aed_mse_possub --embedding_ln_affine=False
launch aed_mse_possub_dropout cpu_aed_mse_possub --dropout_rate=0.2
launch aed_mse_possub_noaffine_seed2 cpu_aed_mse_possub --embedding_ln_affine=False --seed=2
launch aed_mse_possub_dropout_seed2 cpu_aed_mse_possub --dropout_rate=0.2 --seed=2
launch aed_mse_possub_noaffine_seed3 cpu_aed_mse_possub --embedding_ln_affine=False --seed=3
launch aed_mse_possub_dropout_seed3 cpu_aed_mse_possub --dropout_rate=0.2 --seed=3
# the confounds and the first objections (experiments/README.md, The confounds): seed 1337 of each
# first, then 2, 3. flat: the author's schedule (warm-up, then the peak lr: lr_decay_iters 700000 as
# in config/, the run stops at STEPS); matched: config/cpu_baseline_matched.py, a GPT with the key
# AED's non-embedding parameters; deep: the author's shape, config/cpu_aed_deep.py (6 + 6 blocks)
# against config/cpu_baseline_deep.py (12)
for s in 1337 2 3; do
    sfx=$([ $s = 1337 ] && echo "" || echo "_seed$s")
    launch baseline_flat$sfx cpu_baseline --lr_decay_iters=700000 --seed=$s
    launch aed_mse_possub_flat$sfx cpu_aed_mse_possub --lr_decay_iters=700000 --seed=$s
    launch baseline_matched$sfx cpu_baseline_matched --seed=$s
    launch baseline_dropout_flat$sfx cpu_baseline_dropout --lr_decay_iters=700000 --seed=$s
    launch baseline_dropout01$sfx cpu_baseline --dropout_rate=0.1 --seed=$s
    launch aed_mse_possub_dropout01$sfx cpu_aed_mse_possub --dropout_rate=0.1 --seed=$s
    launch aed_mse_possub_noaffine_coeff1$sfx cpu_aed_mse_possub --embedding_ln_affine=False \
        --embedding_loss_coeff=1 --seed=$s
    launch aed_deep$sfx cpu_aed_deep --seed=$s
    launch baseline_deep$sfx cpu_baseline_deep --seed=$s
done
finish
