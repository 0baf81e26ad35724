# The smaller GPT baseline (fewer params than aed_mse_possub): width 156, 12 heads.
# The author's run (docs/model.md, The author's runs): 9000 steps on one A100 in bf16,
# train 2.958, val 3.416 (15,441,192 params).
# $ python train.py config/baseline_small.py
#   (or: torchrun --standalone --nproc_per_node=8 train.py config/baseline_small.py)
# Every other key is train.py's default: the author's common settings (9000 steps of 50 x 16
# sequences of 200 tokens, lr 9e-4, ...).
out_dir = 'out-baseline-small'
arch = 'gpt'
n_embed = 156
n_layer = 26
n_head = 12
