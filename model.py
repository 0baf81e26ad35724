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

ENUMS = {"arch": ("gpt", "aed"), "order_type": ("ORIGINAL", "ALT"),
         "sub_pos_embed_to_decoder": ("NO", "YES_NO_LN", "YES_LN"),
         "embedding_loss_type": ("NONE", "MSE", "COSINE", "LOG_COSINE"),
         "detach_type": ("ENCODER_OUT", "EMBEDDING", "NONE"),
         "embedding_ln_type": ("INIT", "AVG_CUM_SUM", "NONE")}
# the embedding-loss options, and what None means for each when the loss is on
EMBEDDING_LOSS_DEFAULTS = {"embedding_loss_coeff": 1.0, "detach_type": "ENCODER_OUT",
                           "embedding_ln_type": "INIT", "use_ln_on_encoder_out": True,
                           "embedding_ln_affine": True}
Opt = typing.Optional


@dataclass
class ModelConfig:
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
    embedding_ln_type: Opt[str] = None  # INIT | AVG_CUM_SUM | NONE
    use_ln_on_encoder_out: Opt[bool] = None  # LayerNorm enc in the embedding loss
    embedding_ln_affine: Opt[bool] = None  # False: loss LayerNorms have no weight, bias

    def __post_init__(self):
        for f in fields(self):  # in order: arch is checked before the AED-only fields
            v, types = getattr(self, f.name), typing.get_args(f.type) or (f.type,)
            if type(v) is int and float in types:
                setattr(self, f.name, v := float(v))
            # type(), not isinstance: True is not an int here; every int is a count
            if type(v) not in types or v is not None and (v not in ENUMS.get(f.name, (v,))
                                                          or int in types and v < 1):
                kinds = ENUMS.get(f.name) or [t.__name__.replace("NoneType", "None") for t in types]
                raise ValueError(f"{f.name} must be {' or '.join(kinds)}"
                                 f"{' (>= 1)' if int in types else ''}, got {v!r}")
            if v != f.default and f.name in AED_ONLY and self.arch == "gpt":
                raise ValueError(f"{f.name} is an AED option: it must stay {f.default!r} for gpt")
            if v is not None and f.name in EMBEDDING_LOSS_DEFAULTS \
                    and self.embedding_loss_type == "NONE":
                raise ValueError(f"{f.name} is set but embedding_loss_type is NONE")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
        defaults = dict(EMBEDDING_LOSS_DEFAULTS) if self.embedding_loss_type != "NONE" else {}
        if self.arch == "aed":
            defaults.update(n_decoder_layer=self.n_layer, cross_attn_n_head=2 * self.n_head,
                            cross_attn_use_bias=self.use_bias)
        for name, default in defaults.items():  # None means the default
            if getattr(self, name) is None:
                setattr(self, name, default)
        for name in ("n_head", "cross_attn_n_head"):
            if (heads := getattr(self, name)) and self.n_embed % heads:
                raise ValueError(f"n_embed ({self.n_embed}) must be divisible by {name} ({heads})")


AED_ONLY = ("n_decoder_layer", "cross_attn_n_head", "cross_attn_use_bias", "order_type",
            "add_ln_before_decoder_ff", "add_pos_embed_to_decoder", "embedding_loss_type",
            *EMBEDDING_LOSS_DEFAULTS)


class Attention(nn.Module):
    """Causal self-attention, or the AED decoder's cross-attention to the encoder output, causal too
    (encoder position t+1 has read token t+1, the target)."""

    def __init__(self, n_embed, n_head, bias, dropout_rate, cross=False):
        super().__init__()
        self.n_head, self.cross, self.dropout_rate = n_head, cross, dropout_rate
        if cross:
            self.q_proj = nn.Linear(n_embed, n_embed, bias=bias)
            self.kv_proj = nn.Linear(n_embed, 2 * n_embed, bias=bias)
        else:
            self.c_attn = nn.Linear(n_embed, 3 * n_embed, bias=bias)
        self.c_proj = nn.Linear(n_embed, n_embed, bias=bias)
        self.resid_dropout = nn.Dropout(dropout_rate)
        self.layer_idx = None  # this layer's slot in a KVCache, set by Transformer

    def forward(self, x, enc=None, cache=None, pos=None):
        # x: (B, T, C); enc: (B, T, C) the normed encoder output; pos: (T,) their slots in cache
        B, T, C = x.size()
        if self.cross:
            q, k, v = self.q_proj(x), *self.kv_proj(enc).split(C, dim=2)
        else:
            q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        dropout_p = self.dropout_rate if self.training else 0.0  # the author's also did in eval
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        else:  # k, v: (B, nh, context_size, hs) every cached key; mask: what each query sees
            k, v, mask = cache.update(self.layer_idx, pos, k, v)
            # not SDPA: for a few queries on CPU its kernel costs ~100 us; torch.compile fuses these
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, context)
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embed, 4 * config.n_embed, bias=config.use_bias)
        self.c_proj = nn.Linear(4 * config.n_embed, config.n_embed, bias=config.use_bias)
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))  # exact (erf) GELU


class Block(nn.Module):
    """Pre-LN block: x += attn(ln_1(x)); x += mlp(ln_2(x)). An AED decoder block also does
    x += cross_attn(q=ln_q(x), kv=ln_kv(enc)), after self-attention (ORIGINAL) or before (ALT)."""

    def __init__(self, c, cross_attn=False):
        super().__init__()
        C, bias = c.n_embed, c.use_bias
        self.ln_1 = nn.LayerNorm(C, bias=bias)
        self.attn = Attention(C, c.n_head, bias, c.dropout_rate)
        if cross_attn:
            self.ln_q = nn.LayerNorm(C, bias=bias)
            self.ln_kv = nn.LayerNorm(C, bias=bias)  # each decoder block normalizes enc its own way
            self.cross_attn = Attention(C, c.cross_attn_n_head, c.cross_attn_use_bias,
                                        c.dropout_rate, cross=True)
            self.cross_first = c.order_type == "ALT"
        self.ln_2 = nn.LayerNorm(C, bias=bias)
        self.mlp = MLP(c)

    def forward(self, x, enc=None, cache=None, pos=None):
        if enc is not None and self.cross_first:
            x = x + self.cross_attn(self.ln_q(x), self.ln_kv(enc), cache, pos)
        x = x + self.attn(self.ln_1(x), cache=cache, pos=pos)
        if enc is not None and not self.cross_first:
            x = x + self.cross_attn(self.ln_q(x), self.ln_kv(enc), cache, pos)
        return x + self.mlp(self.ln_2(x))


class KVCache:
    """Each attention layer's keys and values in buffers of context_size slots, pos filled."""

    def __init__(self, n_layers, context_size):
        self.k, self.v = [None] * n_layers, [None] * n_layers
        self.context_size, self.pos = context_size, 0

    def update(self, layer_idx, pos, k, v):
        # k, v: (B, nh, T, hs) at pos (T,) -> buffers (B, nh, context_size, hs), mask (T, context)
        for buffers, new in ((self.k, k), (self.v, v)):
            if buffers[layer_idx] is None:  # zeros: a masked slot weighs 0, but 0 * NaN is NaN
                buffers[layer_idx] = new.new_zeros(*new.shape[:2], self.context_size, new.size(3))
            buffers[layer_idx].index_copy_(2, pos, new)
        mask = pos.view(-1, 1) >= torch.arange(self.context_size, device=pos.device)
        return self.k[layer_idx], self.v[layer_idx], mask


class Transformer(nn.Module):
    """The GPT baseline (arch='gpt') or the AED model (arch='aed'); see the module docstring."""

    def __init__(self, config):
        super().__init__()
        self.config = c = config
        C, aed = c.n_embed, c.arch == "aed"
        # tied to the head; rows up to a multiple of vocab_pad_multiple, the extra ones unused
        self.wte = nn.Embedding(-(-c.vocab_size // c.vocab_pad_multiple) * c.vocab_pad_multiple, C)
        shift_pos = (aed and c.add_pos_embed_to_decoder) or c.sub_pos_embed_to_decoder != "NO"
        self.wpe = nn.Embedding(c.context_size + int(shift_pos), C)  # wpe[1..T] needs one row more
        self.drop = nn.Dropout(c.dropout_rate)
        self.blocks = nn.ModuleList([Block(c) for _ in range(c.n_layer)])  # the AED's encoder
        self.decoder_blocks = None
        if aed:
            self.ln_bridge = (nn.LayerNorm(C, bias=c.use_bias) if c.add_ln_before_decoder_ff
                              else None)
            self.bridge = nn.Linear(C, C, bias=c.use_bias)  # "the linear pass" to the decoder
            self.decoder_blocks = nn.ModuleList([Block(c, cross_attn=True)
                                                 for _ in range(c.n_decoder_layer)])
        # here, before the loss LayerNorms: a saved optimizer state follows the parameters' order
        yes_ln = c.sub_pos_embed_to_decoder == "YES_LN"
        self.ln_post = nn.LayerNorm(C, bias=c.use_bias) if yes_ln else None
        if aed:  # the loss LayerNorms have a bias (or no affine part at all); no loss, none of them
            on, affine = c.embedding_loss_type != "NONE", bool(c.embedding_ln_affine)
            ln = lambda: nn.LayerNorm(C, elementwise_affine=affine)  # noqa: E731
            self.ln_a = ln() if on and c.embedding_ln_type != "NONE" else None
            self.ln_b = ln() if on and c.use_ln_on_encoder_out else None
        self.ln_f = nn.LayerNorm(C, bias=c.use_bias)
        self.attention_layers = [m for m in self.modules() if isinstance(m, Attention)]
        for i, m in enumerate(self.attention_layers):
            m.layer_idx = i
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # residual projections: by their stream's depth
            if name.endswith("c_proj.weight"):
                depth = c.n_decoder_layer if name.startswith("decoder_blocks.") else c.n_layer
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * depth))
        self.last_ce = self.last_embedding_loss = self.compiled_decode_step = None

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def get_num_params(self):
        """As the author counts: the tied wte once, without wpe (and without wte's padding rows)."""
        padding = (self.wte.weight.size(0) - self.config.vocab_size) * self.config.n_embed
        return sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel() - padding

    def flops_per_token(self):
        """Training FLOPs per token at T = context_size (PaLM): 6 N + 12 T C per attention layer."""
        c = self.config
        attention = 12 * len(self.attention_layers) * c.n_embed * c.context_size
        return 6 * self.get_num_params() + attention

    def hidden_states(self, idx, cache=None, pos=None):
        """(out, E, enc): the states (B, T, C) before the head of tokens idx (B, T) at positions
        pos (T,), 0..T-1 unless given (with a KVCache), and E and enc for the embedding loss."""
        c = self.config
        if pos is None:
            if idx.size(1) > c.context_size:
                raise ValueError(f"sequence length {idx.size(1)} is longer than context_size "
                                 f"{c.context_size}")
            pos = torch.arange(idx.size(1), dtype=torch.long, device=idx.device)
        x = E = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x, cache=cache, pos=pos)
        enc = x if self.decoder_blocks is not None else None  # no final LayerNorm
        if enc is not None:
            x = self.bridge(enc if self.ln_bridge is None else self.ln_bridge(enc))
            if c.add_pos_embed_to_decoder:  # in place, as the author: under autocast x stays bf16
                x += self.wpe(pos + 1)
            for block in self.decoder_blocks:
                x = block(x, enc=enc, cache=cache, pos=pos)
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
        None). The loss: ce + coeff * embedding loss in training mode, ce in eval mode; its parts,
        detached, in last_ce and last_embedding_loss (None: not computed)."""
        c = self.config
        out, E, enc = self.hidden_states(idx)
        logits = self.head(out)
        if targets is None:
            return logits, None
        ce = F.cross_entropy(logits.reshape(-1, c.vocab_size), targets.view(-1))
        loss, emb = ce, None
        if self.training and enc is not None and c.embedding_loss_type != "NONE":
            emb = self.embedding_distance(*self.embedding_pair(E, enc))
            loss = ce + c.embedding_loss_coeff * emb
        self.last_ce, self.last_embedding_loss = ce.detach(), None if emb is None else emb.detach()
        return logits if return_logits else None, loss

    # the AED's embedding loss (docs/model.md, Embedding loss)
    def embedding_pair(self, E, enc):
        """(avg, target), each (B, T, C): the embedding loss's two sides, from the embeddings E and
        the encoder output enc."""
        E = E.detach() if self.config.detach_type == "EMBEDDING" else E
        enc = enc.detach() if self.config.detach_type == "ENCODER_OUT" else enc
        if self.ln_b is not None:
            enc = self.ln_b(enc)
        if self.config.embedding_ln_type == "INIT":  # before averaging: positions weigh unevenly
            E = self.ln_a(E)
        T = E.size(1)  # the cumulative mean of E: avg[t] = mean of E[0..t]
        avg = cumsum_time(E) / torch.arange(1, T + 1, device=E.device, dtype=E.dtype).view(1, T, 1)
        if self.config.embedding_ln_type == "AVG_CUM_SUM":
            avg = self.ln_a(avg)
        return avg, enc

    def embedding_distance(self, avg, target):
        """MSE, or the mean over positions of 1 - (cos + 1) / 2 (COSINE) or -log((cos + 1) / 2)."""
        if self.config.embedding_loss_type == "MSE":
            return F.mse_loss(avg, target)
        cos = F.cosine_similarity(avg, target, dim=-1)  # (B, T)
        if self.config.embedding_loss_type == "COSINE":
            return (1 - (cos + 1) / 2).mean()
        return -torch.log((cos + 1) / 2).mean()  # LOG_COSINE

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW on the parameters that require grad (a frozen one stays put), weight decay on
        tensors of dim >= 2 only; fused on CUDA and CPU (~10x faster)."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas,
                                 fused=device_type in ("cuda", "cpu"))

    # generation, with a KV cache (docs/model.md, Generation with a KV cache)
    def new_kv_cache(self):
        return KVCache(len(self.attention_layers), self.config.context_size)

    def last_logits(self, idx, cache, pos):
        """Logits (B, vocab_size) of the token after idx (B, T) at pos (T,), against cache."""
        return self.head(self.hidden_states(idx, cache, pos)[0][:, -1, :])

    def compile_decode_step(self, **compile_kwargs):
        """torch.compile the one-token cached step, once for all positions (fixed shapes)."""
        self.compiled_decode_step = torch.compile(self.last_logits, dynamic=False, fullgraph=True,
                                                  **compile_kwargs)

    @torch.no_grad()
    def next_logits(self, idx, cache=None):
        """Logits (B, vocab_size) of the token after idx (B, T), from its last context_size tokens;
        with a cache, only the tokens after cache.pos run (past context_size: refilled)."""
        window = idx[:, -self.config.context_size:]
        if cache is None:
            return self.last_logits(window, None, None)
        if idx.size(1) > self.config.context_size:
            cache.pos, new = 0, window
        else:  # a copy: a view into the growing idx would bring a new stride (a recompile)
            new = idx[:, cache.pos:].clone(memory_format=torch.contiguous_format)
        pos = torch.arange(cache.pos, cache.pos + new.size(1), device=idx.device)
        # the first call fills (allocates) the cache; then single tokens may take the compiled step
        compiled = new.size(1) == 1 and cache.pos > 0 and self.compiled_decode_step is not None
        logits = (self.compiled_decode_step if compiled else self.last_logits)(new, cache, pos)
        cache.pos += new.size(1)
        return logits

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, kv_cache=True,
                 on_token=lambda t: None):
        """Sample max_new_tokens tokens after idx (B, T) (temperature 0: the argmax), each also to
        on_token."""
        cache = self.new_kv_cache() if kv_cache else None
        for _ in range(max_new_tokens):
            logits = self.next_logits(idx, cache)  # (B, vocab_size)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            if temperature == 0:
                idx_next = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:  # inverse-CDF sampling: torch.multinomial's distribution at a tenth of its cost
                cdf = F.softmax(logits / temperature, dim=-1).cumsum(dim=-1)
                u = torch.rand(cdf.size(0), 1, device=cdf.device) * cdf[:, -1:]  # in [0, total)
                idx_next = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.size(-1) - 1)
            on_token(idx_next)  # (B, 1), e.g. to print it as it comes
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


def build_model(config):
    return Transformer(config)


# x.cumsum(dim=1), compiled as eager's ATen kernel (Inductor's own failed on CUDA: docs/gpu.md)
@torch.library.custom_op("aed::cumsum_time", mutates_args=())
def cumsum_time(x: torch.Tensor) -> torch.Tensor:
    return x.cumsum(dim=1)


cumsum_time.register_fake(lambda x: torch.empty_like(x))
cumsum_time.register_autograd(lambda ctx, grad: cumsum_time(grad.flip(1)).flip(1))  # as ATen's
