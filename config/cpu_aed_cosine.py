# CPU version of the author's run aed_cosine (config/aed_cosine.py; docs/model.md, The author's
# runs): AED with the cosine-dissimilarity embedding loss (coefficient 1), no positional
# subtraction. The author's run, 9000 steps on one A100: train 2.993, val 3.387.
# $ python train.py config/cpu_aed_cosine.py    (all eight CPU runs: bash experiments/cpu_runs.sh)
include('aed_cosine.py')  # the author's run: its model options
include('cpu_common.py')  # the CPU runs' training settings, and context 128
out_dir = 'out-cpu-aed-cosine'
# at the CPU size of cpu_aed_mse_possub: 2 encoder + 2 decoder blocks of width 96
n_embed = 96
n_layer = 2
n_head = 4
cross_attn_n_head = 8
