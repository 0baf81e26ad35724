# CPU version of the author's run baseline_small (config/baseline_small.py; docs/model.md, The
# author's runs): The smaller GPT baseline, with fewer params than cpu_aed_mse_possub: the author's
# went from width 160 to 156 and from 10 to 12 heads; this one goes from 98 to 96, from 7 to 8
# heads. The author's run, 9000 steps on one A100: train 2.958, val 3.416 (15,441,192 params).
# $ python train.py config/cpu_baseline_small.py
#   (all eight CPU runs: bash experiments/cpu_runs.sh)
include('baseline_small.py')  # the author's run: a narrower GPT
include('cpu_common.py')  # the CPU runs' training settings, and context 128
out_dir = 'out-cpu-baseline-small'
# cpu_baseline's 4 blocks, narrower: width 96, 8 heads
n_embed = 96
n_layer = 4
n_head = 8
