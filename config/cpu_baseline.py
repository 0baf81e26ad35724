# CPU preset: a small decoder-only GPT baseline, parameter matched to config/cpu_aed_mse_possub.py
# (the AED model has slightly fewer parameters, as in the author's comparison), same data, steps
# and batches; about 5 minutes on 2 idle cores on the default data (python prepare.py).
# $ python train.py config/cpu_baseline.py && python sample.py --out_dir=out-cpu-baseline
out_dir = 'out-cpu-baseline'
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

# model: 4 blocks of width 98, as deep as the AED preset's 2 + 2
arch = 'gpt'
vocab_size = 50257
context_size = 128
n_embed = 98
n_layer = 4
n_head = 7
dropout_rate = 0.0
use_bias = False
