# The smaller GPT baseline (fewer params than aed_mse_possub): width 156, 12 heads.
# The author's run (SPEC section 4), 9000 steps on one A100 in bf16: train 2.958, val 3.416 (15,441,192 params).
# $ python train.py config/baseline_small.py    (or: torchrun --standalone --nproc_per_node=8 train.py config/baseline_small.py)
out_dir = 'out-baseline-small'
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
arch = 'gpt'
vocab_size = 50257
context_size = 200
n_embed = 156
n_layer = 26
n_head = 12
dropout_rate = 0.0
use_bias = False
