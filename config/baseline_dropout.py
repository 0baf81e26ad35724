# The GPT baseline with dropout 0.2.
# The author's run (docs/model.md, The author's runs): 9000 steps on one A100 in bf16,
# train 3.174, val 3.406 (16,036,800 params).
# $ python train.py config/baseline_dropout.py
#   (or: torchrun --standalone --nproc_per_node=8 train.py config/baseline_dropout.py)
# Every other key is train.py's default: the author's common settings (9000 steps of 50 x 16
# sequences of 200 tokens, lr 9e-4, ...).
out_dir = 'out-baseline-dropout'
arch = 'gpt'
n_embed = 160
n_layer = 26
n_head = 10
dropout_rate = 0.2
