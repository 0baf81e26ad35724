# AED with no embedding loss and no positional subtraction.
# The author's run (docs/model.md, The author's runs): 9000 steps on one A100 in bf16,
# train 3.043, val 3.413.
# $ python train.py config/aed_plain.py
#   (or: torchrun --standalone --nproc_per_node=8 train.py config/aed_plain.py)
# Every other key is train.py's default: the author's common settings (9000 steps of 50 x 16
# sequences of 200 tokens, lr 9e-4, ...) and the AED at the author's size (13 encoder + 13 decoder
# blocks of width 150).
out_dir = 'out-aed-plain'
arch = 'aed'
cross_attn_n_head = 10  # 2 x n_head, as the author set it
cross_attn_use_bias = False
