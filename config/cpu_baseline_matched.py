# The GPT preset widened until its non-embedding parameters (all but wte) are within 1% of the AED
# preset's (config/cpu_aed_mse_possub.py), at the same depth: 4 blocks, as the AED's 2 + 2. Wider,
# not deeper: one more block would overshoot by ~10%. The counts: python bench.py --sections=params
include('cpu_baseline.py')
out_dir = 'out-cpu-baseline-matched'
n_embed = 105
n_head = 7  # head size 15 (the preset's: 14)
