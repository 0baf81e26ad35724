# CPU version of the author's run baseline_dropout (config/baseline_dropout.py; docs/model.md, The
# author's runs): The GPT baseline with dropout 0.2 (otherwise cpu_baseline). The author's run, 9000
# steps on one A100: train 3.174, val 3.406 (16,036,800 params).
# $ python train.py config/cpu_baseline_dropout.py
#   (all eight CPU runs: bash experiments/cpu_runs.sh)
include('baseline_dropout.py')  # the author's run: a GPT with dropout 0.2
include('cpu_common.py')  # the CPU runs' training settings, and context 128
out_dir = 'out-cpu-baseline-dropout'
# cpu_baseline's 4 blocks of width 98
n_embed = 98
n_layer = 4
n_head = 7
