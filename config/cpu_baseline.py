# CPU preset: a small decoder-only GPT baseline, parameter matched to config/cpu_aed_mse_possub.py
# (the AED model has slightly fewer parameters, as in the author's comparison), same data, steps
# and batches; about 7-9 minutes on 2 idle cores on the default data (python prepare.py).
# $ python train.py config/cpu_baseline.py && python sample.py --out_dir=out-cpu-baseline
include('baseline.py')  # the author's run: a GPT
include('cpu_common.py')  # the CPU runs' training settings, and context 128
out_dir = 'out-cpu-baseline'
# 4 blocks of width 98, as deep as the AED preset's 2 + 2
n_embed = 98
n_layer = 4
n_head = 7
