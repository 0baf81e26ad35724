# What the CPU study scripts share (sourced, not run): each run trains once, JOBS at a time with
# one thread each, resumes after any stop, and leaves a small committed copy of its logs.
#
# The sourcing script sets OUT (where runs train: checkpoints, not in git), OUT_NAME (OUT's default,
# written in place of an absolute OUT in the committed copies), RES (the committed copies), ARGS
# (train.py arguments every run gets after its config), RUNS (every run's name) and a report
# function (tables and charts from the finished runs); then calls `launch NAME CONFIG [args]` for
# each run and `finish`. EXTRA: arguments for every run from the script's command line.
export OMP_NUM_THREADS=1

have() { grep -qs '"status": "finished"' "$RES/$1/summary.json"; }

run() {  # run <run name> <config name> [extra train.py args...]
    local name=$1 out=$OUT/$1 res=$RES/$1 config=config/$2.py
    shift 2
    if have "$name"; then
        echo "=== $name: finished (in $res), skipped"
        return
    fi
    local args=("$config" "${ARGS[@]}" "$@" ${EXTRA[@]+"${EXTRA[@]}"} --out_dir="$out")
    if [ -f "$out/ckpt_last.pt" ]; then
        args+=(--init_from=resume)
    elif [ -f "$out/log.jsonl" ]; then
        # killed before its first checkpoint: nothing to resume, start it over
        args+=(--overwrite=True)
    fi
    echo "=== $(date -u +%H:%M:%S) start: ${args[*]}"
    mkdir -p "$OUT"
    # in the background and waited for, so that a kill of this job (`pkill -f` matches it as well as
    # the script) reaches train.py, which stops cleanly, instead of leaving it running on its own
    python train.py "${args[@]}" >> "$out.log" 2>&1 &
    local pid=$!
    trap 'kill -TERM $pid 2>/dev/null; wait $pid; exit 143' TERM
    if ! wait $pid; then
        echo "=== $name failed: the end of $out.log:"; tail -n 5 "$out.log"; return 1
    fi
    grep -q '"status": "finished"' "$out/summary.json"
    # the committed copy: small (no per-step records but the last), written whole before it counts
    mkdir -p "$res"
    {
        grep -v '"type": "step"' "$out/log.jsonl"
        grep '"type": "step"' "$out/log.jsonl" | tail -n 1
    } > "$res/log.jsonl.tmp"
    mv "$res/log.jsonl.tmp" "$res/log.jsonl"
    cp "$out/summary.json" "$res/summary.json.tmp"
    mv "$res/summary.json.tmp" "$res/summary.json"
    # no path of this machine in what is committed: an absolute OUT becomes the default's name
    if [ "${OUT#/}" != "$OUT" ]; then
        sed -i "s#\"$OUT/#\"$OUT_NAME/#g" "$res/summary.json" "$res/log.jsonl"
    fi
    echo "=== $(date -u +%H:%M:%S) $name finished: $(tail -n 1 "$out.log")"
}

launch() {  # launch <run name> <config name> [args]: run it in the background once one of the
            # JOBS slots is free
    while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-2}" ]; do
        wait -n || true  # a failed run does not stop the others; the end says which failed
        report
    done
    run "$@" &
}

# Ctrl-C or a kill stops the runs too (background jobs of a script ignore SIGINT by themselves)
stop_runs() {
    local p
    for p in $(jobs -rp); do pkill -TERM -P "$p" 2>/dev/null; kill "$p" 2>/dev/null; done
    wait
    exit 130
}
trap stop_runs INT TERM
start=$(date +%s)

finish() {  # wait for the runs, rewriting the tables as each ends; say which did not finish
    while [ -n "$(jobs -rp)" ]; do
        wait -n || true
        report
    done
    wait || true  # any job that ended between the checks above
    report
    echo "=== this invocation: $(( ($(date +%s) - start) / 60 )) min"
    local missing=() r
    for r in "${RUNS[@]}"; do have "$r" || missing+=("$r"); done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "=== not finished: ${missing[*]} (see $OUT/<run>.log; run the script again to retry)"
        exit 1
    fi
}
