#!/usr/bin/env bash
# train.py's step on one GPU under probes (experiments/gpu_probe.py): 30 steps of the author's two
# configs with train.py's defaults, as they are and with one thing changed; docs/gpu.md (Where a
# step's time goes) says what they showed. Runs (<model>: gpt, aed):
#   <model>_inductor  train.py as it is (Inductor's code for the embedding's backward: atomics)
#   <model>_aten      the embedding's backward as ATen's kernel (sorts the ids, no atomics)
#   <model>_random    as it is, on uniform random ids (data/random_ids: as many as the text's)
#   <model>_profile   as it is, with torch.profiler over steps 14-16 (OUT/<run>/profile.json)
#   <model>_nocudnn   cuDNN's attention off (the profile's second-largest kernel)
#   <model>_shapepad  Inductor's force_shape_pad: GEMM sizes padded (the AED's width 150)
#   <model>_pad64     --vocab_pad_multiple=64: the head's 50,257 rows padded to 50,304
#   <model>_fused     the head and the loss in chunks, the logits never all in memory
#   <model>_rank      one rank of the card's 8-GPU command: DDP on (the environment torchrun
#                     --nproc_per_node=1 sets), 100 sequences a step in one forward, profiled
#
# $ OUT=experiments/gpu_train_step bash experiments/gpu_train_step.sh   all, in ALL's order
#                                                     (a GPT run ~1.5 min on one H200)
# $ OUT=... bash experiments/gpu_train_step.sh gpt_inductor gpt_aten   only the runs named
#
# Writes OUT/<run>/ (summary.json, log.jsonl), OUT.md (the table) and OUT.log (the console); the
# runs train in RUNS/train_step/<run> (default out-gpu), on DATA/wikipedia (default data).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to a folder for the results}
RUNS=${RUNS:-out-gpu}
DATA=${DATA:-data}
ALL=(gpt_inductor aed_inductor gpt_rank aed_rank gpt_fused aed_fused gpt_pad64 aed_pad64
     gpt_nocudnn aed_nocudnn aed_shapepad gpt_profile aed_profile gpt_random aed_random gpt_aten
     aed_aten)
ORDER=("${ALL[@]}")
[ $# -gt 0 ] && ORDER=("$@")
for name in "${ORDER[@]}"; do
    [[ " ${ALL[*]} " == *" $name "* ]] || { echo "error: unknown run $name" >&2; exit 2; }
done
mkdir -p "$OUT"
exec > >(tee -a "$OUT.log") 2>&1
python -c 'import sys, torch; torch.cuda.is_available() or sys.exit("error: no CUDA GPU here")
print("===", torch.cuda.get_device_name(0), torch.__version__)' || exit 1
[ -f "$DATA/wikipedia/train.bin" ] || python prepare.py --data_dir="$DATA"
python - "$DATA" <<'PY'
import json, os, shutil, sys
import numpy as np
src, dst = f"{sys.argv[1]}/wikipedia", f"{sys.argv[1]}/random_ids"
os.makedirs(dst, exist_ok=True)
meta = json.load(open(f"{src}/meta.json"))
rng = np.random.default_rng(0)
for split in ("train", "val"):
    n = len(np.memmap(f"{src}/{split}.bin", dtype=np.uint16, mode="r"))
    rng.integers(0, meta["vocab_size"], n, dtype=np.uint16).tofile(f"{dst}/{split}.bin")
shutil.copy(f"{src}/meta.json", f"{dst}/meta.json")
PY
for name in "${ORDER[@]}"; do
    cfg=$([ "${name%%_*}" = gpt ] && echo config/baseline.py || echo config/aed_mse_possub.py)
    way=${name#*_} data=wikipedia flags=() ddp=()
    [ "$way" = random ] && way=inductor data=random_ids
    [ "$way" = pad64 ] && way=inductor flags=(--vocab_pad_multiple=64)
    [ "$way" = rank ] && way=profile flags=(--gradient_accumulation_steps=2) \
        ddp=(RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=localhost MASTER_PORT=29511)
    echo "=== $(date -u +%H:%M:%S) $name"
    mkdir -p "$OUT/$name"
    env ${ddp[@]+"${ddp[@]}"} python experiments/gpu_probe.py "$way" "$OUT/$name/profile.json" \
        -- train.py "$cfg" \
        --data_dir="$DATA" --dataset="$data" --train_steps=30 \
        --warmup_iters=7 --lr_decay_iters=17111 --est_interval=30 --est_steps=20 \
        --log_interval=10 --out_dir="$RUNS/train_step/$name" --overwrite=True \
        ${flags[@]+"${flags[@]}"} &&
        cp "$RUNS/train_step/$name/"{summary.json,log.jsonl} "$OUT/$name/"
    python - "$OUT" > "$OUT.md.tmp" <<'PY' && mv "$OUT.md.tmp" "$OUT.md"
import glob, json, os, statistics, sys
print("| run | ms a step (median of 11-30) | GPU | torch | val ce at 30 |\n|---|---:|---|---|---:|")
for d in sorted(glob.glob(f"{sys.argv[1]}/*/")):
    if not os.path.exists(f"{d}summary.json"):
        continue
    s = json.load(open(f"{d}summary.json"))
    ms = [r["ms"] for r in map(json.loads, open(f"{d}log.jsonl"))
          if r.get("type") == "step" and r["step"] > 10]
    print(f"| {os.path.basename(d[:-1])} | {statistics.median(ms):.1f} | {s['gpu']} "
          f"| {s['torch']} | {s['final_val_loss']:.4f} |")
PY
done
