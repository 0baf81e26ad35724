# What the byte-level runs (config/bytes_*.py) share: UTF-8 bytes as tokens
# (python prepare.py --tokenizer=bytes), a data-constrained slice seen many times, the author's
# schedule (warm-up, then a flat lr), on one CPU thread. Not a run of its own. A run takes ~1 h; a
# first look (--train_steps=1000) ~10 min, past the 3-gram floor (docs/data.md, Bytes as tokens).
device = 'cpu'
dtype = 'float32'
compile = False  # no faster than eager on a CPU (docs/performance.md)
dataset = 'wikipedia_bytes'
vocab_size = 256
context_size = 256
train_tokens = 1_000_000  # the first 1M bytes of train.bin: 24.6 epochs; 0: all (one's own text)
batch_size = 16
gradient_accumulation_steps = 1
lr = 2e-3
warmup_iters = 100  # then train.py's default schedule, the author's: ~flat over train_steps
min_lr = 2e-4  # the CPU presets': over 6,000 steps the lr stays within 0.02% of lr
train_steps = 6000
est_interval = 200
est_steps = 20
log_interval = 100
