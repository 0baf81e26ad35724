# CPU version of the author's run baseline_dropout (config/baseline_dropout.py, SPEC section 4):
# The GPT baseline with dropout 0.2 (otherwise cpu_baseline).
# The author's run, 9000 steps on one A100: train 3.174, val 3.406 (16,036,800 params).
# $ python train.py config/cpu_baseline_dropout.py    (all eight CPU runs: bash experiments/cpu_runs.sh)
out_dir = 'out-cpu-baseline-dropout'
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

# model: cpu_baseline's 4 blocks of width 98, with dropout 0.2
arch = 'gpt'
vocab_size = 50257
context_size = 128
n_embed = 98
n_layer = 4
n_head = 7
dropout_rate = 0.2
use_bias = False
