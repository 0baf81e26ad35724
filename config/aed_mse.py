# AED with the MSE embedding loss, no positional subtraction.
# The author's run (SPEC section 4), 9000 steps on one A100 in bf16: train 2.998, val 3.385.
# $ python train.py config/aed_mse.py    (or: torchrun --standalone --nproc_per_node=8 train.py config/aed_mse.py)
out_dir = 'out-aed-mse'
# common to all of the author's runs (SPEC section 4): 9000 steps of 50 x 16 sequences of 200 tokens
dataset = 'wikipedia'
batch_size = 50
gradient_accumulation_steps = 16
lr = 9e-4
min_lr = 9e-5
warmup_iters = 300
lr_decay_iters = 700000  # the lr stays ~constant after warm-up
decay_lr = True
beta1 = 0.9
beta2 = 0.95
weight_decay = 0.1
grad_clip = 0.0  # no clipping
train_steps = 9000
est_interval = 500
est_steps = 200

# model
arch = 'aed'
vocab_size = 50257
context_size = 200
n_embed = 150
n_layer = 13  # 13 encoder + 13 decoder blocks
n_head = 5
dropout_rate = 0.0
use_bias = False
cross_attn_n_head = 10
cross_attn_use_bias = False
order_type = 'ORIGINAL'
add_ln_before_decoder_ff = False
add_pos_embed_to_decoder = False
sub_pos_embed_to_decoder = 'NO'
embedding_loss_type = 'MSE'
embedding_loss_coeff = 1.0
detach_type = 'ENCODER_OUT'
embedding_ln_type = 'INIT'
use_ln_on_encoder_out = True
