# The byte-level AED: the key config (MSE embedding loss x 8, positional subtraction) at 2 encoder
# + 2 decoder blocks of width 128, 0.97M parameters. Compare with config/bytes_baseline.py.
# $ python prepare.py --tokenizer=bytes && python train.py config/bytes_aed_mse_possub.py
include('aed_mse_possub.py')  # the author's run: its model options
include('bytes_common.py')
out_dir = 'out-bytes-aed-mse-possub'
n_embed = 128
n_layer = 2
n_head = 4
cross_attn_n_head = 8
