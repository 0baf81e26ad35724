# The AED preset at the author's shape: 6 encoder + 6 decoder blocks (the author: 13 + 13), narrower
# (80) so that a step costs about the preset's FLOPs. Its GPT is config/cpu_baseline_deep.py.
include('cpu_aed_mse_possub.py')
out_dir = 'out-cpu-aed-deep'
n_layer = 6
n_embed = 80
n_head = 4  # head size 20
cross_attn_n_head = 8  # 2 x n_head, as the author set it
