# The decoder-only GPT baseline: 26 blocks of width 160.
# The author's run (docs/model.md, The author's runs): 9000 steps on one A100 in bf16,
# train 2.937, val 3.424 (16,036,800 params).
# $ python train.py config/baseline.py
#   (or: torchrun --standalone --nproc_per_node=8 train.py config/baseline.py)
# Every other key is train.py's default: the author's common settings (9000 steps of 50 x 16
# sequences of 200 tokens, lr 9e-4, ...).
out_dir = 'out-baseline'
arch = 'gpt'
n_embed = 160
n_layer = 26
n_head = 10
