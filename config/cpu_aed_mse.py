# CPU version of the author's run aed_mse (config/aed_mse.py, SPEC section 4):
# AED with the MSE embedding loss (coefficient 1), no positional subtraction.
# The author's run, 9000 steps on one A100: train 2.998, val 3.385.
# $ python train.py config/cpu_aed_mse.py    (all eight CPU runs: bash experiments/cpu_runs.sh)
out_dir = 'out-cpu-aed-mse'
# common to all eight CPU runs: the settings of the presets config/cpu_aed_mse_possub.py and config/cpu_baseline.py
dataset = 'wikipedia'
device = 'cpu'
dtype = 'float32'
compile = False  # no faster than eager on this CPU, and compiling costs 18-27 s: see README
# a short run: small batches (more steps per token: measured better for the AED model here), a higher lr,
# a short warm-up and a cosine decay to min_lr by the last step
batch_size = 8
gradient_accumulation_steps = 1
lr = 2e-3
min_lr = 2e-4
warmup_iters = 40
train_steps = 600
lr_decay_iters = 600
decay_lr = True
beta1 = 0.9
beta2 = 0.95
weight_decay = 0.1
grad_clip = 0.0
est_interval = 150
est_steps = 12
log_interval = 50

# model: aed_mse's options at the CPU size of cpu_aed_mse_possub (2 encoder + 2 decoder blocks of width 96)
arch = 'aed'
vocab_size = 50257
context_size = 128
n_embed = 96
n_layer = 2
n_head = 4
dropout_rate = 0.0
use_bias = False
cross_attn_n_head = 8
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
