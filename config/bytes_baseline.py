# The byte-level GPT: 4 blocks, as deep as the AED's 2 + 2, widened until its non-embedding
# parameters (all but wte) are within 1% of config/bytes_aed_mse_possub.py's (942,060 against
# 936,064: python bench.py --sections=params).
# $ python prepare.py --tokenizer=bytes && python train.py config/bytes_baseline.py
include('baseline.py')  # the author's run: a GPT
include('bytes_common.py')
out_dir = 'out-bytes-baseline'
n_embed = 140
n_layer = 4
n_head = 4
