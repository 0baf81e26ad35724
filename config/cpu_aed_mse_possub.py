# CPU preset: a small AED model like aed_mse_possub (MSE embedding loss, coefficient 8, positional
# subtraction), about 7-9 minutes on 2 idle cores on the default data (python prepare.py).
# Compare with config/cpu_baseline.py: same data, steps and batches, slightly more parameters.
# $ python train.py config/cpu_aed_mse_possub.py &&
#   python sample.py --out_dir=out-cpu-aed-mse-possub
include('aed_mse_possub.py')  # the author's run: its model options
include('cpu_common.py')  # the CPU runs' training settings, and context 128
out_dir = 'out-cpu-aed-mse-possub'
# a CPU size: 2 encoder + 2 decoder blocks of width 96
n_embed = 96
n_layer = 2
n_head = 4
cross_attn_n_head = 8
