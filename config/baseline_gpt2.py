# The GPT baseline at GPT-2 small's size: 12 blocks of width 768, 12 heads, context 1024, vocab
# 50257 (123,551,232 params: no biases, no vocab padding). For GPUs; pair it with
# config/aed_gpt2.py.
# $ python prepare.py --input=corpus.txt --name=corpus &&
#   torchrun --standalone --nproc_per_node=8 train.py config/baseline_gpt2.py --dataset=corpus
# Hyperparameters: what depends on the model's size is nanoGPT's GPT-2 small recipe (train_gpt2.py):
# lr 6e-4 decaying towards 6e-5, steps of 491,520 tokens (12 x 1024 x 40), grad_clip 1.0; the
# author's 9e-4 was tuned for 16M-parameter models, and larger models want a smaller lr. The
# protocol is the author's (docs/model.md, The author's settings), so the pair's runs compare as the
# author's do: 9000 steps, 300 warm-up steps then a ~constant lr (lr_decay_iters 700000, as all the
# author's runs), estimates every 500 steps over 200 batches. Both recipes agree on the rest: AdamW
# betas (0.9, 0.95), weight decay 0.1 on matrices, no dropout, no biases. Every other key is
# train.py's default (the author's protocol). 9000 steps are 4.4B tokens, about 36 per parameter
# (the author's runs saw about 90 per parameter).
out_dir = 'out-baseline-gpt2'
include('gpt2_common.py')  # the pair's training settings, and context 1024
arch = 'gpt'
n_embed = 768
n_layer = 12
n_head = 12
