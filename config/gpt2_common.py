# What the GPT-2-size pair (config/baseline_gpt2.py, config/aed_gpt2.py) shares; each includes this
# file. Not a run of its own. See config/baseline_gpt2.py for why these values.
batch_size = 12
gradient_accumulation_steps = 40  # the global count: 5 per GPU on 8 GPUs
micro_batch = 0  # forwards of batch_size, as nanoGPT: 12 x 1024 tokens
lr = 6e-4
min_lr = 6e-5
grad_clip = 1.0
context_size = 1024
