# AED with the cosine-dissimilarity embedding loss, no positional subtraction.
# The author's run (docs/model.md, The author's runs): 9000 steps on one A100 in bf16,
# train 2.993, val 3.387.
# $ python train.py config/aed_cosine.py
#   (or: torchrun --standalone --nproc_per_node=8 train.py config/aed_cosine.py)
# Every other key is train.py's default: the author's common settings (9000 steps of 50 x 16
# sequences of 200 tokens, lr 9e-4, ...) and the AED at the author's size (13 encoder + 13 decoder
# blocks of width 150).
out_dir = 'out-aed-cosine'
arch = 'aed'
cross_attn_n_head = 10  # 2 x n_head, as the author set it
cross_attn_use_bias = False
embedding_loss_type = 'COSINE'
embedding_loss_coeff = 1.0
detach_type = 'ENCODER_OUT'
embedding_ln_type = 'INIT'
use_ln_on_encoder_out = True
