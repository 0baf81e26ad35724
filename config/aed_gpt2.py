# The AED pair of config/baseline_gpt2.py: aed_mse_possub's options (MSE embedding loss with
# coefficient 8, positional subtraction) with 6 encoder + 6 decoder blocks, as deep as the
# baseline's 12, context 1024. Width 704, not 768: at 768 the 6 + 6 blocks would have 138,309,120
# params, 12% more than the baseline's 123,551,232 (a decoder block is 16C^2 + 4C against a GPT
# block's 12C^2 + 2C). The author's pair made the AED narrower (150 against 160) to stay just below
# the baseline; so does this one. 704 is the widest width below the baseline's count that splits
# into heads of a multiple of 8 (GPU attention kernels want that): 11 heads of 64 as GPT-2's, 22
# cross-attention heads of 32. 119,168,896 params, 3.5% fewer (no width from 705 to 719, the widest
# still below, splits so).
# $ python prepare.py --input=corpus.txt --name=corpus &&
#   torchrun --standalone --nproc_per_node=8 train.py config/aed_gpt2.py --dataset=corpus
# Hyperparameters: the same as config/baseline_gpt2.py (see there why); the model options:
# aed_mse_possub's.
include('aed_mse_possub.py')  # the author's run: its model options
out_dir = 'out-aed-gpt2'
include('gpt2_common.py')  # the pair's training settings, and context 1024
n_embed = 704
n_layer = 6  # 6 encoder + 6 decoder blocks
n_head = 11
cross_attn_n_head = 22
