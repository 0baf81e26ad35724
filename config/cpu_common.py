# What every CPU run (config/cpu_*.py) shares: the eight presets include this file after the
# author's run each mirrors, the study's configs a preset. Not a run of its own. Every key not set
# here or in the run's files is train.py's default.
device = 'cpu'
dtype = 'float32'
# no faster than eager on this CPU, and compiling costs 18-27 s (docs/performance.md)
compile = False
# a short run: small batches (more steps per token: measured better for the AED model here), a
# higher lr, a short warm-up and a cosine decay to min_lr by the last step
batch_size = 8
gradient_accumulation_steps = 1
lr = 2e-3
min_lr = 2e-4
warmup_iters = 40
train_steps = 600
lr_decay_iters = 600
est_interval = 150
est_steps = 12
log_interval = 50
context_size = 128
