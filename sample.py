"""
Sample from a model trained by train.py (AED or GPT; the checkpoint says which), token by token.
$ python sample.py --out_dir=out-cpu-aed-mse-possub --start="The history of" --num_samples=3
$ python sample.py --out_dir=out-cpu-baseline --start=FILE:prompt.txt --kv_cache=False
"""
import codecs
import os
import signal
import sys
from contextlib import suppress

from configurator import (ConfigError, collect_defaults, die, interrupt_on_signals, load_config,
                          resolve_device, stop)

# -----------------------------------------------------------------------------
out_dir = 'out'           # where train.py wrote its checkpoints
checkpoint = 'best'       # 'best' (lowest val loss) or 'last' -> out_dir/ckpt_{checkpoint}.pt
start = '\n'              # the prompt, or FILE:path to read it from a file
num_samples = 3
max_new_tokens = 200      # tokens per sample (bytes, for a model trained on bytes)
temperature = 0.8         # < 1 sharper, > 1 more random; 0 = greedy (always the most likely token)
top_k = 200               # keep the k most likely tokens at each step; 0 = no top-k
seed = 1337
device = 'auto'           # 'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'            # 'auto' (bfloat16 on cuda if supported, else float16; float32 elsewhere)
kv_cache = True           # cache attention keys/values; False recomputes everything per token
compile = False           # compile the one-token step (kv_cache only): pays off over many tokens
# -----------------------------------------------------------------------------
DEFAULTS = collect_defaults(globals())

for arg in sys.argv[1:]:  # a config file (.py) may stand alone, a run folder may not
    if not arg.startswith('-') and not arg.endswith('.py'):
        die(f"unexpected argument '{arg}': give the run's folder as --out_dir={arg}")
try:
    globals().update(load_config(DEFAULTS, sys.argv[1:]))
except ConfigError as e:
    die(e)
if checkpoint not in ('best', 'last'):
    die(f"checkpoint must be 'best' or 'last', got {checkpoint!r}")
if num_samples < 1 or max_new_tokens < 0 or top_k < 0 or temperature < 0:
    die("need num_samples >= 1, max_new_tokens >= 0, top_k >= 0 and temperature >= 0 (0: greedy)")

# the model, from the checkpoint alone: its config says which architecture and shape
ckpt_path = os.path.join(out_dir, f'ckpt_{checkpoint}.pt')
if not os.path.isfile(ckpt_path):
    die(f"no checkpoint at {ckpt_path}; train one first, e.g. python train.py "
        f"config/cpu_aed_mse_possub.py, then python sample.py --out_dir=out-cpu-aed-mse-possub")
if start.startswith('FILE:'):  # the prompt
    try:
        with open(start[5:], encoding='utf-8') as f:
            start = f.read()
    except OSError as e:
        die(f"cannot read prompt file {start[5:]}: {e.strerror}")
    except UnicodeDecodeError as e:
        die(f"prompt file {start[5:]} is not UTF-8 text (byte {e.start})")
try:
    device, device_type, dtype, autocast = resolve_device(device, dtype)
except ConfigError as e:
    die(e)
import torch  # after the checks above: a mistake is told without the seconds of this import

from checkpoint import load as load_checkpoint
from engine import Engine
from model import Transformer
from tokenizer import EOT, get_tokenizer  # here: EOT is no config key

torch.manual_seed(seed)
try:
    ckpt, model_config = load_checkpoint(ckpt_path)  # checksum, config vs weights, finite weights
except ConfigError as e:  # (a CheckpointError)
    die(e)
model = Transformer(model_config)
model.load_state_dict(ckpt['model'])
model.eval().to(device)
engine = Engine(model, compile=compile)  # compile: the one-token step
enc = get_tokenizer(ckpt.get('tokenizer', 'gpt2'))  # the run's data: GPT-2 ids or bytes
ids = enc.encode(start, allowed_special={EOT}) or [enc.eot_token]  # '': eot
if max(ids) >= model_config.vocab_size:
    die(f"the prompt has token id {max(ids)}, the model's vocab_size is {model_config.vocab_size}")
x = torch.tensor([ids], device=device)  # (1, T)


# each token is printed as it is sampled. A character's UTF-8 bytes may be split across tokens: the
# incremental decoder holds them back until it is complete, so the pieces add up to enc.decode()
def print_tokens(ids):  # ids: (1, n)
    print(utf8.decode(b''.join(map(enc.decode_single_token_bytes, ids[0].tolist()))), end='',
          flush=True)


print(f"{model_config.arch} model, {model.get_num_params():,} params, step {ckpt.get('step')}, "
      f"{ckpt_path}, kv_cache {'on' if kv_cache else 'off'}"
      f"{', compiled' if compile and kv_cache else ''}", file=sys.stderr, flush=True)
interrupt_on_signals()  # Ctrl-C and SIGTERM between two tokens; `| head` ends it quietly
try:
    with torch.no_grad(), autocast:
        for _ in range(num_samples):
            utf8 = codecs.getincrementaldecoder('utf-8')(errors='replace')  # as enc.decode
            print_tokens(x)  # the prompt
            engine.generate(x, max_new_tokens, temperature=temperature, top_k=top_k or None,
                            kv_cache=kv_cache, on_token=print_tokens)
            print(utf8.decode(b'', final=True) + '\n---------------', flush=True)
except KeyboardInterrupt as e:
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # exit 128 + signal, even into a closed pipe
    with suppress(OSError):  # (a pipe whose reader has gone: the exit comes all the same)
        print(flush=True)  # ends the sample's line
    stop(e.args[0], "error: interrupted")
