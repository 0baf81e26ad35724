# AED with the MSE embedding loss (coefficient 8) and the positional subtraction: the headline
# model. The author's run (docs/model.md, The author's runs): 9000 steps on one A100 in bf16, train
# 2.982, val 3.378 (15,763,500 params).
# $ python train.py config/aed_mse_possub.py
#   (or: torchrun --standalone --nproc_per_node=8 train.py config/aed_mse_possub.py)
# Every other key is train.py's default: the author's common settings (9000 steps of 50 x 16
# sequences of 200 tokens, lr 9e-4, ...) and the AED at the author's size (13 encoder + 13 decoder
# blocks of width 150).
out_dir = 'out-aed-mse-possub'
arch = 'aed'
cross_attn_n_head = 10  # 2 x n_head, as the author set it
cross_attn_use_bias = False
sub_pos_embed_to_decoder = 'YES_NO_LN'
embedding_loss_type = 'MSE'
embedding_loss_coeff = 8.0
detach_type = 'ENCODER_OUT'
embedding_ln_type = 'INIT'
use_ln_on_encoder_out = True
