# The AED pair of config/baseline_gpt2.py: aed_mse_possub's options (MSE embedding loss with coefficient 8,
# positional subtraction) with 6 encoder + 6 decoder blocks, as deep as the baseline's 12, context 1024.
# Width 704, not 768: at 768 the 6 + 6 blocks would have 138,309,120 params, 12% more than the baseline's
# 123,551,232 (a decoder block is 16C^2 + 4C against a GPT block's 12C^2 + 2C). The author's pair made the AED
# narrower (150 against 160) to stay just below the baseline; so does this one. 704 is the widest width below
# the baseline's count that splits into heads of a multiple of 8 (GPU attention kernels want that): 11 heads of
# 64 as GPT-2's, 22 cross-attention heads of 32. 119,168,896 params, 3.5% fewer (no width from 705 to 719,
# the widest still below, splits so).
# $ python prepare.py --input=corpus.txt --name=corpus && torchrun --standalone --nproc_per_node=8 train.py config/aed_gpt2.py --dataset=corpus
# Hyperparameters: the same as config/baseline_gpt2.py (see there why).
out_dir = 'out-aed-gpt2'
dataset = 'wikipedia'  # any corpus: python prepare.py --input=... --name=NAME, then --dataset=NAME
batch_size = 12
gradient_accumulation_steps = 40  # the global count: 5 per GPU on 8 GPUs
lr = 6e-4
min_lr = 6e-5
warmup_iters = 300
lr_decay_iters = 700000  # the lr stays ~constant after warm-up
decay_lr = True
beta1 = 0.9
beta2 = 0.95
weight_decay = 0.1
grad_clip = 1.0
train_steps = 9000
est_interval = 500
est_steps = 200

# model
arch = 'aed'
vocab_size = 50257
context_size = 1024
n_embed = 704
n_layer = 6  # 6 encoder + 6 decoder blocks
n_head = 11
dropout_rate = 0.0
use_bias = False
cross_attn_n_head = 22
cross_attn_use_bias = False
order_type = 'ORIGINAL'
add_ln_before_decoder_ff = False
add_pos_embed_to_decoder = False
sub_pos_embed_to_decoder = 'YES_NO_LN'
embedding_loss_type = 'MSE'
embedding_loss_coeff = 8.0
detach_type = 'ENCODER_OUT'
embedding_ln_type = 'INIT'
use_ln_on_encoder_out = True
