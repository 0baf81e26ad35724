"""
The auto-regressive encoder-decoder transformer (AED) and the GPT baseline (docs/model.md).
GPT: wte + wpe -> n_layer causal blocks -> ln_f [-> minus wpe of the next positions] -> tied head
AED: wte + wpe = E -> n_layer causal blocks = enc -> Linear -> n_decoder_layer decoder blocks
     (self-attention, cross-attention to enc, MLP) -> ln_f -> minus wpe of the next positions ->
     tied head; in training, + the embedding loss between E's cumulative mean and enc. All causal.
"""
import math
import typing
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
from torch.nn import functional as F

Opt = typing.Optional
# the embedding-loss options, and what None means for each when the loss is on
EMBEDDING_LOSS_DEFAULTS = {"embedding_loss_coeff": 1.0, "detach_type": "ENCODER_OUT",
                           "embedding_ln_type": "INIT", "use_ln_on_encoder_out": True,
                           "embedding_ln_affine": True}


@dataclass
class ModelConfig:
    """The model's options. Each field is checked against its annotation (bool, int, float or str,
    or Opt[...] of one: None allowed) and the rules at the end of this file; a field a fork adds
    needs only a type and a default (and its name in AED_ONLY or COUNTS there if one of those rules
    is to hold for it)."""
    arch: str = "aed"  # "gpt" (decoder-only baseline) or "aed"
    vocab_size: int = 50257  # GPT-2's BPE vocabulary
    vocab_pad_multiple: int = 1  # wte's rows up to a multiple of this (e.g. 64)
    context_size: int = 200  # tokens per sequence (and rows of wpe)
    n_embed: int = 150  # width C
    n_layer: int = 13  # AED: n_layer encoder blocks + n_decoder_layer decoder blocks
    n_head: int = 5  # self-attention heads
    dropout_rate: float = 0.0  # in training mode only
    use_bias: bool = False  # biases in Linears and LayerNorms (not the embedding loss's)
    sub_pos_embed_to_decoder: str = "NO"  # NO | YES_NO_LN | YES_LN: minus wpe[1..T] at the head
    # AED only: must stay at these defaults when arch == "gpt"
    n_decoder_layer: Opt[int] = None  # None -> n_layer
    cross_attn_n_head: Opt[int] = None  # None -> 2 * n_head
    cross_attn_use_bias: Opt[bool] = None  # None -> use_bias
    order_type: str = "ORIGINAL"  # ORIGINAL: self-attn, cross-attn, MLP; ALT: cross-attn first
    add_ln_before_decoder_ff: bool = False  # LayerNorm before the encoder -> decoder Linear
    add_pos_embed_to_decoder: bool = False  # add wpe[1..T] to the decoder input
    embedding_loss_type: str = "NONE"  # NONE | MSE | COSINE | LOG_COSINE
    # embedding-loss options: None while the loss is NONE, else None -> EMBEDDING_LOSS_DEFAULTS
    embedding_loss_coeff: Opt[float] = None  # loss = ce + coeff * embedding loss
    detach_type: Opt[str] = None  # ENCODER_OUT | EMBEDDING | NONE
    embedding_ln_type: Opt[str] = None  # INIT: LN(E) then mean; AVG_CUM_SUM: mean then LN; NONE
    use_ln_on_encoder_out: Opt[bool] = None  # LayerNorm enc in the embedding loss
    embedding_ln_affine: Opt[bool] = None  # False: loss LayerNorms have no weight, bias

    def __post_init__(self):
        """Checks every field (check_fields, at the end of this file); then replaces each None in
        use by the value it stands for, and checks that the heads divide n_embed."""
        check_fields(self)
        if self.arch == "aed":  # each None in use: the value it stands for
            derived = dict(n_decoder_layer=self.n_layer, cross_attn_n_head=2 * self.n_head,
                           cross_attn_use_bias=self.use_bias)
            if self.embedding_loss_type != "NONE":
                derived.update(EMBEDDING_LOSS_DEFAULTS)
            for name, value in derived.items():
                if getattr(self, name) is None:
                    setattr(self, name, value)
        for name in ("n_head", "cross_attn_n_head"):
            heads = getattr(self, name)
            if heads and self.n_embed % heads:
                raise ValueError(f"n_embed ({self.n_embed}) must be divisible by {name} ({heads})")


def layer_norm(c):  # every LayerNorm but the embedding loss's
    return nn.LayerNorm(c.n_embed, bias=c.use_bias)


def loss_layer_norm(c):
    """The embedding loss's, as the author's: a bias whatever use_bias, or no affine part at all."""
    return nn.LayerNorm(c.n_embed, elementwise_affine=c.embedding_ln_affine)


class Attention(nn.Module):
    """Causal self-attention, or (cross=True) the AED decoder's cross-attention to the encoder
    output, causal too: the encoder's output at t+1 has read token t+1, position t's target."""

    def __init__(self, c, cross=False):
        super().__init__()
        C, bias = c.n_embed, (c.cross_attn_use_bias if cross else c.use_bias)
        self.n_head = c.cross_attn_n_head if cross else c.n_head
        if cross:
            self.q_proj, self.kv_proj = nn.Linear(C, C, bias=bias), nn.Linear(C, 2 * C, bias=bias)
        else:
            self.c_attn = nn.Linear(C, 3 * C, bias=bias)
        self.c_proj = nn.Linear(C, C, bias=bias)
        self.resid_dropout = nn.Dropout(c.dropout_rate)

    def forward(self, x, enc=None, cache=None, pos=None):
        # x: (B, T, C); enc: (B, T, C) the normed encoder output (cross-attention); pos: (T,) their
        # slots in cache
        B, T, C = x.size()
        if enc is None:  # self-attention
            q, k, v = self.c_attn(x).split(C, dim=2)
        else:  # cross-attention: queries from the decoder, keys and values from enc
            q = self.q_proj(x)
            k, v = self.kv_proj(enc).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is None:
            # attention dropout at the residual's rate, in training only (the author's code also
            # dropped in eval: docs/model.md, "Where we differ from the author's code")
            p = self.resid_dropout.p if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:  # generation (engine.py): every key and value cached so far, each query seeing the
            # slots up to its own position; not SDPA: for a few queries on CPU it costs ~100 us
            k, v = cache.update(self, pos, k, v)  # (B, nh, context_size, hs)
            mask = pos.view(-1, 1) >= torch.arange(k.size(2), device=pos.device)  # (T, slots)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))  # (B, nh, T, slots)
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        C, bias = c.n_embed, c.use_bias
        self.c_fc, self.c_proj = nn.Linear(C, 4 * C, bias=bias), nn.Linear(4 * C, C, bias=bias)
        self.dropout = nn.Dropout(c.dropout_rate)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))  # exact (erf) GELU


class Block(nn.Module):
    """Pre-LN block: x += attn(ln_1(x)); x += mlp(ln_2(x)). An AED decoder block also does
    x += cross_attn(q=ln_q(x), kv=ln_kv(enc)), after self-attention (ORIGINAL) or before (ALT)."""

    def __init__(self, c, cross_attn=False):
        super().__init__()
        self.ln_1, self.attn = layer_norm(c), Attention(c)
        if cross_attn:  # ln_kv: each decoder block normalizes enc its own way
            self.ln_q, self.ln_kv = layer_norm(c), layer_norm(c)
            self.cross_attn = Attention(c, cross=True)
            self.cross_first = c.order_type == "ALT"
        self.ln_2, self.mlp = layer_norm(c), MLP(c)

    def forward(self, x, enc=None, cache=None, pos=None):
        if enc is not None and self.cross_first:
            x = x + self.cross_attn(self.ln_q(x), self.ln_kv(enc), cache, pos)
        x = x + self.attn(self.ln_1(x), cache=cache, pos=pos)
        if enc is not None and not self.cross_first:
            x = x + self.cross_attn(self.ln_q(x), self.ln_kv(enc), cache, pos)
        return x + self.mlp(self.ln_2(x))


# x.cumsum(dim=1), compiled as eager's ATen kernel (Inductor's own failed on CUDA: docs/gpu.md; an
# op of a fork's needs no such wrapper unless Inductor fails on it). A custom op needs its fake
# (shapes only) and its backward: the gradient of a cumulative sum over time is the reversed
# cumulative sum of the reversed gradient
@torch.library.custom_op("aed::cumsum_time", mutates_args=())
def cumsum_time(x: torch.Tensor) -> torch.Tensor:
    return x.cumsum(dim=1)


cumsum_time.register_fake(lambda x: torch.empty_like(x))
cumsum_time.register_autograd(lambda ctx, grad: cumsum_time(grad.flip(1)).flip(1))  # as ATen's


class Transformer(nn.Module):
    """The GPT baseline (arch='gpt') or the AED model (arch='aed'); see the module docstring.
    checkpoint.py builds it on the meta device for its shapes (on the CPU if __init__ reads a value
    there, e.g. .item()). Saves refuse NaN/inf in every saved tensor: a buffer holding -inf (a
    mask) goes unsaved (register_buffer(..., persistent=False))."""

    def __init__(self, config):
        super().__init__()
        self.config = c = config
        C = c.n_embed
        # tied to the head; vocab_size rounded up to a multiple of vocab_pad_multiple, the extra
        # rows unused
        rows = math.ceil(c.vocab_size / c.vocab_pad_multiple) * c.vocab_pad_multiple
        self.wte = nn.Embedding(rows, C)
        # wpe[1..T], the next positions, added to the decoder input or subtracted at the head:
        # one row more
        next_pos = c.add_pos_embed_to_decoder or c.sub_pos_embed_to_decoder != "NO"
        self.wpe = nn.Embedding(c.context_size + int(next_pos), C)
        self.drop = nn.Dropout(c.dropout_rate)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))  # the AED's encoder
        self.ln_bridge = layer_norm(c) if c.add_ln_before_decoder_ff else None
        self.decoder_blocks = None
        if c.arch == "aed":
            self.bridge = nn.Linear(C, C, bias=c.use_bias)  # "the linear pass" to the decoder
            self.decoder_blocks = nn.ModuleList(Block(c, cross_attn=True)
                                                for _ in range(c.n_decoder_layer))
        # here, before the loss LayerNorms, as in checkpoints already written: AdamW's saved state
        # is matched to the parameters by position. (A parameter a fork adds may go anywhere: a
        # checkpoint without it is refused by name first.)
        self.ln_post = layer_norm(c) if c.sub_pos_embed_to_decoder == "YES_LN" else None
        # the embedding loss's LayerNorms (no loss: none of them)
        self.ln_a = loss_layer_norm(c) if c.embedding_ln_type in ("INIT", "AVG_CUM_SUM") else None
        self.ln_b = loss_layer_norm(c) if c.use_ln_on_encoder_out else None
        self.ln_f = layer_norm(c)
        self.attention_layers = [m for m in self.modules() if isinstance(m, Attention)]
        self.apply(self._init_weights)  # Linear, Embedding ~ N(0, 0.02); LayerNorms keep 1 and 0
        # GPT-2's scaled init of the residual projections (c_proj): 0.02 / sqrt(2 * depth), depth
        # the blocks of their stack: n_layer for the GPT and the encoder, n_decoder_layer for the
        # decoder (unset, it is n_layer: the author's init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                depth = c.n_decoder_layer if name.startswith("decoder_blocks.") else c.n_layer
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * depth))

    def _init_weights(self, module):
        # by module type, as nanoGPT: a fork's own nn.Parameter keeps the init it was made with
        # (its Linear and Embedding modules are drawn as these)
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def get_num_params(self):
        """As the author counts: the tied wte once, without wpe (and without wte's padding rows)."""
        padding = self.wte.weight[self.config.vocab_size:]
        return sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel() - padding.numel()

    def flops_per_token(self):
        """Training FLOPs per token at T = context_size (PaLM): 6 N + 12 T C per attention layer."""
        attention = 12 * len(self.attention_layers) * self.config.n_embed * self.config.context_size
        return 6 * self.get_num_params() + attention

    def hidden_states(self, idx, cache=None, pos=None):
        """(out, E, enc): the states (B, T, C) before the head of tokens idx (B, T) at positions
        pos (T,), 0..T-1 unless given (with a KVCache), and E and enc for the embedding loss (enc:
        None in the GPT). With a cache only the new tokens run: what a fork mixes across positions
        outside Attention must go through the cache too (test_model.py compares with no cache)."""
        c, enc = self.config, None
        if pos is None:
            if idx.size(1) > c.context_size:
                raise ValueError(f"sequence length {idx.size(1)} is longer than context_size "
                                 f"{c.context_size}")
            pos = torch.arange(idx.size(1), device=idx.device)
        x = E = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C); E for the embedding loss
        for block in self.blocks:
            x = block(x, cache=cache, pos=pos)
        if self.decoder_blocks is not None:  # the AED: enc, the encoder output, has no LayerNorm
            enc = x
            x = self.bridge(enc if self.ln_bridge is None else self.ln_bridge(enc))
            # in place, as the author's (legal: the Linear's backward needs its input, not x): x
            # stays bf16 under autocast (x + wpe would be float32; cast back to bf16, it would
            # still round wpe's gradient differently)
            if c.add_pos_embed_to_decoder:
                x += self.wpe(pos + 1)
            for block in self.decoder_blocks:
                x = block(x, enc, cache, pos)
        out = self.ln_f(x)
        if c.sub_pos_embed_to_decoder != "NO":  # minus the position of the token predicted, t + 1
            out = out - self.wpe(pos + 1)
            if self.ln_post is not None:
                out = self.ln_post(out)
        return out, E, enc

    def head(self, out):
        """The tied head: logits (..., vocab_size) = out @ wte.T, without wte's padding rows."""
        return F.linear(out, self.wte.weight)[..., :self.config.vocab_size]

    def forward(self, idx, targets=None, return_logits=True):
        """idx, targets: (B, T) -> (logits (B, T, vocab_size), or None if not return_logits; loss or
        None; the loss's parts, detached: {'ce': ...}, and 'emb' with the embedding loss). The
        loss: ce + coeff * embedding loss in training mode, ce in eval mode. train.py averages the
        loss and each part over a step's forwards (so each a mean over rows, a 0-dim tensor, in
        every forward) and logs them; on CUDA it runs this under CUDA graphs (no host syncs).
        Generation (engine.py) takes its logits from hidden_states and head, not from here."""
        c = self.config
        out, E, enc = self.hidden_states(idx)
        logits = self.head(out)
        if targets is None:
            return logits, None, {}
        ce = F.cross_entropy(logits.reshape(-1, c.vocab_size), targets.view(-1))
        loss, parts = ce, {"ce": ce.detach()}
        if self.training and c.embedding_loss_type != "NONE":
            emb = self.embedding_distance(*self.embedding_pair(E, enc))
            loss = ce + c.embedding_loss_coeff * emb
            parts["emb"] = emb.detach()
        return logits if return_logits else None, loss, parts

    # the AED's embedding loss (docs/model.md, Embedding loss)
    def embedding_pair(self, E, enc):
        """(avg, target), each (B, T, C): the embedding loss's two sides, from the embeddings E and
        the encoder output enc."""
        c = self.config
        E = E.detach() if c.detach_type == "EMBEDDING" else E
        enc = enc.detach() if c.detach_type == "ENCODER_OUT" else enc
        if self.ln_b is not None:
            enc = self.ln_b(enc)
        if c.embedding_ln_type == "INIT":  # before averaging: positions weigh unevenly
            E = self.ln_a(E)
        # the cumulative mean of E: avg[t] = mean of E[0..t]
        avg = cumsum_time(E) / torch.arange(1, E.size(1) + 1, device=E.device,
                                            dtype=E.dtype).view(-1, 1)
        if c.embedding_ln_type == "AVG_CUM_SUM":  # after averaging
            avg = self.ln_a(avg)
        return avg, enc

    def embedding_distance(self, avg, target):
        """MSE, or the mean over positions of 1 - (cos + 1) / 2 (COSINE) or -log((cos + 1) / 2)."""
        kind = self.config.embedding_loss_type
        if kind == "MSE":
            return F.mse_loss(avg, target)
        half = (F.cosine_similarity(avg, target, dim=-1) + 1) / 2  # (B, T): (cos + 1) / 2
        return (1 - half).mean() if kind == "COSINE" else -torch.log(half).mean()  # LOG_COSINE

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW on the parameters that require grad (a frozen one stays put), weight decay on
        tensors of dim >= 2 only; fused on CUDA and CPU (~10x faster)."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas,
                                 fused=device_type in ("cuda", "cpu"))


# ModelConfig's rules (check_fields): the values each str option may take, the options of the
# AED alone (they stay at their defaults in the GPT), the counts
ENUMS = {"arch": ("gpt", "aed"), "order_type": ("ORIGINAL", "ALT"),
         "sub_pos_embed_to_decoder": ("NO", "YES_NO_LN", "YES_LN"),
         "embedding_loss_type": ("NONE", "MSE", "COSINE", "LOG_COSINE"),
         "detach_type": ("ENCODER_OUT", "EMBEDDING", "NONE"),
         "embedding_ln_type": ("INIT", "AVG_CUM_SUM", "NONE")}
AED_ONLY = ("n_decoder_layer", "cross_attn_n_head", "cross_attn_use_bias", "order_type",
            "add_ln_before_decoder_ff", "add_pos_embed_to_decoder", "embedding_loss_type",
            *EMBEDDING_LOSS_DEFAULTS)
COUNTS = ("vocab_size", "vocab_pad_multiple", "context_size", "n_embed", "n_layer", "n_head",
          "n_decoder_layer", "cross_attn_n_head")  # each >= 1 (another int may be 0)


def check_fields(c):
    """Each field of ModelConfig c against its annotation and the rules above, in declared order
    (arch before the AED options, embedding_loss_type before its options)."""
    for f in fields(c):
        name, v = f.name, getattr(c, f.name)
        types = typing.get_args(f.type) or (f.type,)  # Opt[int]: (int, NoneType)
        if type(v) is int and float in types:  # 8 for a float: 8.0
            v = float(v)
            setattr(c, name, v)
        if type(v) not in types:  # type(), not isinstance: True is not an int here
            kinds = " or ".join(t.__name__.replace("NoneType", "None") for t in types)
            raise ValueError(f"{name} must be {kinds}, got {v!r}")
        if name in ENUMS and v is not None and v not in ENUMS[name]:
            raise ValueError(f"{name} must be {' or '.join(ENUMS[name])}, got {v!r}")
        if name in COUNTS and v is not None and v < 1:
            raise ValueError(f"{name} must be >= 1, got {v!r}")
        off = None  # why the field must stay at its default, if it must
        if c.arch == "gpt" and name in AED_ONLY:
            off = "arch is gpt (an AED option)"
        elif name in EMBEDDING_LOSS_DEFAULTS and c.embedding_loss_type == "NONE":
            off = "embedding_loss_type is NONE"
        if off and v != f.default:
            raise ValueError(f"{name} must stay {f.default!r} while {off}")
    if not 0.0 <= c.dropout_rate < 1.0:
        raise ValueError(f"dropout_rate must be in [0, 1), got {c.dropout_rate}")
