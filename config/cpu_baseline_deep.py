# The GPT for config/cpu_aed_deep.py: 12 blocks, as deep as the AED's 6 + 6, about its parameters
# (python bench.py --sections=params), with the GPT preset's head size.
include('cpu_baseline.py')
out_dir = 'out-cpu-baseline-deep'
n_layer = 12
n_embed = 84
n_head = 6  # head size 14, as config/cpu_baseline.py
