"""
The auto-regressive encoder-decoder transformer (AED) and the decoder-only GPT baseline (docs/model.md):
GPT: tokens -> wte + wpe -> n_layer causal blocks -> ln_f [-> minus wpe of the next positions] -> tied head
AED: tokens -> wte + wpe = E -> n_layer causal blocks = enc -> the bridge (Linear) -> n_decoder_layer decoder blocks
     (causal self-attention, causal cross-attention to enc, MLP) -> ln_f -> minus wpe of the next positions -> tied
     head; in training, + the embedding loss between the cumulative mean of E and enc. Every part is causal."""

import math
import typing
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
from torch.nn import functional as F

ENUMS = {"arch": ("gpt", "aed"), "order_type": ("ORIGINAL", "ALT"),
         "sub_pos_embed_to_decoder": ("NO", "YES_NO_LN", "YES_LN"),
         "embedding_loss_type": ("NONE", "MSE", "COSINE", "LOG_COSINE"),
         "detach_type": ("ENCODER_OUT", "EMBEDDING", "NONE"), "embedding_ln_type": ("INIT", "AVG_CUM_SUM", "NONE"),
         "embedding_agg_type": ("MEAN", "LEARNED")}
# the embedding-loss options, and what None means for each when the loss is on
EMBEDDING_LOSS_DEFAULTS = {"embedding_loss_coeff": 1.0, "detach_type": "ENCODER_OUT", "embedding_ln_type": "INIT",
                           "use_ln_on_encoder_out": True, "embedding_agg_type": "MEAN", "embedding_ln_affine": True}


@dataclass
class ModelConfig:
    arch: str = "aed"  # "gpt" (decoder-only baseline) or "aed"
    vocab_size: int = 50257  # GPT-2's BPE vocabulary
    vocab_pad_multiple: int = 1  # wte's rows rounded up to a multiple of this (e.g. 64, for GPU matmuls); same outputs
    context_size: int = 200  # tokens per sequence (and rows of wpe)
    n_embed: int = 150  # width C
    n_layer: int = 13  # AED: n_layer encoder blocks + n_decoder_layer decoder blocks
    n_head: int = 5  # self-attention heads
    dropout_rate: float = 0.0  # in training mode only
    use_bias: bool = False  # biases in every Linear and LayerNorm (not the embedding-loss LayerNorms)
    sub_pos_embed_to_decoder: str = "NO"  # NO | YES_NO_LN | YES_LN: subtract wpe[1..T] before the head (both archs)
    # AED only: must stay at these defaults when arch == "gpt"
    n_decoder_layer: typing.Optional[int] = None  # None -> n_layer
    cross_attn_n_head: typing.Optional[int] = None  # None -> 2 * n_head
    cross_attn_use_bias: typing.Optional[bool] = None  # None -> use_bias
    order_type: str = "ORIGINAL"  # ORIGINAL: self-attn, cross-attn, MLP; ALT: cross-attn first
    add_ln_before_decoder_ff: bool = False  # LayerNorm before the encoder -> decoder Linear
    add_pos_embed_to_decoder: bool = False  # add wpe[1..T] to the decoder input
    embedding_loss_type: str = "NONE"  # NONE | MSE | COSINE | LOG_COSINE
    # embedding-loss options: None while the loss is NONE; None -> EMBEDDING_LOSS_DEFAULTS when it is on
    embedding_loss_coeff: typing.Optional[float] = None  # loss = ce + coeff * embedding loss
    detach_type: typing.Optional[str] = None  # ENCODER_OUT | EMBEDDING | NONE
    embedding_ln_type: typing.Optional[str] = None  # INIT | AVG_CUM_SUM | NONE
    use_ln_on_encoder_out: typing.Optional[bool] = None  # LayerNorm enc in the embedding loss
    embedding_agg_type: typing.Optional[str] = None  # MEAN (cumulative mean) | LEARNED (learned causal weighting)
    embedding_ln_affine: typing.Optional[bool] = None  # False: loss LayerNorms without weight and bias (no collapse)

    def __post_init__(self):
        for f in fields(self):  # in order: arch is checked before the AED-only fields
            value, allowed = getattr(self, f.name), typing.get_args(f.type) or (f.type,)
            if type(value) is int and float in allowed:
                setattr(self, f.name, value := float(value))
            if type(value) not in allowed:  # type(), not isinstance: True is not an int here
                names = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
                raise ValueError(f"{f.name} must be {names}, got {value!r}")
            if value is not None and value not in ENUMS.get(f.name, (value,)):
                raise ValueError(f"{f.name} must be one of {', '.join(ENUMS[f.name])}, got {value!r}")
            if self.arch == "gpt" and f.name in AED_ONLY and value != f.default:
                raise ValueError(f"{f.name} is an AED option: it must stay {f.default!r} when arch is 'gpt'")
        if self.arch == "aed":  # None means the default
            self.n_decoder_layer = self.n_layer if self.n_decoder_layer is None else self.n_decoder_layer
            self.cross_attn_n_head = 2 * self.n_head if self.cross_attn_n_head is None else self.cross_attn_n_head
            self.cross_attn_use_bias = self.use_bias if self.cross_attn_use_bias is None else self.cross_attn_use_bias
        for name in ("vocab_size", "vocab_pad_multiple", "context_size", "n_embed", "n_layer", "n_head",
                     "n_decoder_layer", "cross_attn_n_head"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("n_head", "cross_attn_n_head"):
            if getattr(self, name) is not None and self.n_embed % getattr(self, name):
                raise ValueError(f"n_embed ({self.n_embed}) must be divisible by {name} ({getattr(self, name)})")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
        for name, default in EMBEDDING_LOSS_DEFAULTS.items():  # (all None on the GPT: checked above)
            if self.embedding_loss_type == "NONE" and getattr(self, name) is not None:
                raise ValueError(f"{name} is set but embedding_loss_type is NONE")
            if self.embedding_loss_type != "NONE" and getattr(self, name) is None:
                setattr(self, name, default)


AED_ONLY = ("n_decoder_layer", "cross_attn_n_head", "cross_attn_use_bias", "order_type", "add_ln_before_decoder_ff",
            "add_pos_embed_to_decoder", "embedding_loss_type") + tuple(EMBEDDING_LOSS_DEFAULTS)


class Attention(nn.Module):
    """Causal self-attention, or the AED decoder's cross-attention to the encoder output, causal too (encoder
    position t+1 has read token t+1, the target)."""

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
        # x: (B, T, C); enc: (B, T, C) the normed encoder output (cross-attention); pos: (T,) their slots in cache
        B, T, C = x.size()
        q, k, v = (self.q_proj(x), *self.kv_proj(enc).split(C, dim=2)) if self.cross else self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        dropout_p = self.dropout_rate if self.training else 0.0  # the author's code also dropped out in eval
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        else:  # k, v: (B, nh, context_size, hs), every cached key; mask: (T, context_size), which each query sees
            k, v, mask = cache.update(self.layer_idx, pos, k, v)
            # not SDPA: for a few queries on CPU its kernel costs ~100 us a call; torch.compile fuses these ops
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, context_size)
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
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
    """Pre-LN block: x += attn(ln_1(x)); x += mlp(ln_2(x)). An AED decoder block (cross_attn=True) also
    does x += cross_attn(q=ln_q(x), kv=ln_kv(enc)): after self-attention (ORIGINAL) or before it (ALT)."""

    def __init__(self, c, cross_attn=False):
        super().__init__()
        C, bias = c.n_embed, c.use_bias
        self.ln_1 = nn.LayerNorm(C, bias=bias)
        self.attn = Attention(C, c.n_head, bias, c.dropout_rate)
        if cross_attn:
            self.ln_q = nn.LayerNorm(C, bias=bias)
            self.ln_kv = nn.LayerNorm(C, bias=bias)  # each decoder block normalizes enc its own way
            self.cross_attn = Attention(C, c.cross_attn_n_head, c.cross_attn_use_bias, c.dropout_rate, cross=True)
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
    """Keys and values of every attention layer, in fixed buffers of context_size positions, pos of them filled."""

    def __init__(self, n_layers, context_size):
        self.k, self.v, self.context_size, self.pos = [None] * n_layers, [None] * n_layers, context_size, 0

    def update(self, layer_idx, pos, k, v):
        # k, v: (B, nh, T, hs) at pos (T,) -> buffers (B, nh, context_size, hs), mask (T, context_size): slots <= pos
        if self.k[layer_idx] is None:  # zeros, not empty: a masked slot gets weight 0, and 0 * NaN garbage is NaN
            self.k[layer_idx] = k.new_zeros(*k.shape[:2], self.context_size, k.size(3))
            self.v[layer_idx] = v.new_zeros(*v.shape[:2], self.context_size, v.size(3))
        self.k[layer_idx].index_copy_(2, pos, k)
        self.v[layer_idx].index_copy_(2, pos, v)
        mask = pos.view(-1, 1) >= torch.arange(self.context_size, device=pos.device)  # (T, context_size)
        return self.k[layer_idx], self.v[layer_idx], mask


class Transformer(nn.Module):
    """The GPT baseline (arch='gpt') or the AED model (arch='aed'); see the module docstring."""

    def __init__(self, config):
        super().__init__()
        self.config = c = config
        C, aed = c.n_embed, c.arch == "aed"
        # tied to the output head (logits = out @ wte.T); rows up to a multiple of vocab_pad_multiple, the extra unused
        self.wte = nn.Embedding(-(-c.vocab_size // c.vocab_pad_multiple) * c.vocab_pad_multiple, C)
        shift_pos = (aed and c.add_pos_embed_to_decoder) or c.sub_pos_embed_to_decoder != "NO"  # uses wpe[1..T]
        self.wpe = nn.Embedding(c.context_size + int(shift_pos), C)  # one row past the context when shifted
        self.drop = nn.Dropout(c.dropout_rate)
        self.blocks = nn.ModuleList([Block(c) for _ in range(c.n_layer)])  # GPT: all of it; AED: the encoder
        self.decoder_blocks = None
        if aed:
            self.ln_bridge = nn.LayerNorm(C, bias=c.use_bias) if c.add_ln_before_decoder_ff else None
            self.bridge = nn.Linear(C, C, bias=c.use_bias)  # "the linear pass" from encoder to decoder
            self.decoder_blocks = nn.ModuleList([Block(c, cross_attn=True) for _ in range(c.n_decoder_layer)])
        # here, between the decoder and the loss LayerNorms: a saved optimizer state follows the parameters' order
        self.ln_post = nn.LayerNorm(C, bias=c.use_bias) if c.sub_pos_embed_to_decoder == "YES_LN" else None
        if aed:  # the embedding loss's LayerNorms always have a bias (or no affine part); no loss, none of them
            on, affine = c.embedding_loss_type != "NONE", bool(c.embedding_ln_affine)
            self.ln_a = nn.LayerNorm(C, elementwise_affine=affine) if on and c.embedding_ln_type != "NONE" else None
            self.ln_b = nn.LayerNorm(C, elementwise_affine=affine) if on and c.use_ln_on_encoder_out else None
            if c.embedding_agg_type == "LEARNED":
                # W[t, s] for s <= t only, packed row by row (t mixes E'[0..t] whatever the weights); 1-D: no decay
                rows, cols = torch.tril_indices(c.context_size, c.context_size)  # (n,), (n,)
                self.embedding_agg = nn.Parameter(1.0 / (rows + 1).float())  # the cumulative mean: 1 / (t + 1)
                self.register_buffer("embedding_agg_index", torch.stack((rows, cols)), persistent=False)  # (2, n)
        self.ln_f = nn.LayerNorm(C, bias=c.use_bias)
        self.attention_layers = [m for m in self.modules() if isinstance(m, Attention)]
        for i, m in enumerate(self.attention_layers):
            m.layer_idx = i
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # residual projections, scaled by their stream's depth (GPT-2)
            if name.endswith("c_proj.weight"):
                depth = c.n_decoder_layer if name.startswith("decoder_blocks.") else c.n_layer
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * depth))
        self.last_ce = self.last_embedding_loss = self.compiled_decode_step = None  # see forward, compile_decode_step

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def get_num_params(self):
        """As the author counts: all parameters, the tied wte once, minus wpe (and minus wte's padding rows)."""
        padding = (self.wte.weight.size(0) - self.config.vocab_size) * self.config.n_embed
        return sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel() - padding

    def flops_per_token(self):
        """Training FLOPs per token at T = context_size (PaLM, nanoGPT): 6 N + 12 T C per attention layer."""
        c = self.config
        return 6 * self.get_num_params() + 12 * len(self.attention_layers) * c.n_embed * c.context_size

    def hidden_states(self, idx, cache=None, pos=None):
        """The hidden states (B, T, C) before the tied head of tokens idx (B, T) at positions pos (T,), 0..T-1 unless
        given (through cache, a KVCache, when given), and E and enc for the embedding loss."""
        c = self.config
        if pos is None:
            if idx.size(1) > c.context_size:
                raise ValueError(f"sequence length {idx.size(1)} is longer than context_size {c.context_size}")
            pos = torch.arange(idx.size(1), dtype=torch.long, device=idx.device)  # (T,)
        x = E = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x, cache=cache, pos=pos)
        enc = x if self.decoder_blocks is not None else None  # the AED's encoder output (B, T, C), no final LayerNorm
        if enc is not None:  # the AED: the bridge, then the decoder, cross-attending to enc
            x = self.bridge(enc if self.ln_bridge is None else self.ln_bridge(enc))
            if c.add_pos_embed_to_decoder:  # in place, as the author's code: under autocast x stays bf16
                x += self.wpe(pos + 1)
            for block in self.decoder_blocks:
                x = block(x, enc=enc, cache=cache, pos=pos)
        out = self.ln_f(x)
        if c.sub_pos_embed_to_decoder != "NO":  # positional subtraction: the position of the token predicted, t + 1
            out = out - self.wpe(pos + 1)
            if self.ln_post is not None:
                out = self.ln_post(out)
        return out, E, enc

    def head(self, out):
        """The tied output head: logits (..., vocab_size) = out @ wte.T, wte's padding rows left out."""
        return F.linear(out, self.wte.weight)[..., :self.config.vocab_size]

    def forward(self, idx, targets=None, return_logits=True):
        """idx, targets: (B, T) -> (logits (B, T, vocab_size), or None if not return_logits; loss or None). The
        loss: ce + coeff * embedding loss in training mode, ce in eval mode; its parts, detached, in last_ce and
        last_embedding_loss (None: not computed)."""
        c = self.config
        out, E, enc = self.hidden_states(idx)
        logits = self.head(out)  # (B, T, vocab_size)
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
    def embedding_pair(self, E, enc, affine=True):
        """The two sides of the embedding loss, from the embeddings E and the encoder output enc: (avg, target), each
        (B, T, C). affine=False leaves out the loss LayerNorms' learned weights and biases."""
        E = E.detach() if self.config.detach_type == "EMBEDDING" else E
        enc = enc.detach() if self.config.detach_type == "ENCODER_OUT" else enc  # only the embeddings learn from it
        ln = (lambda m, x: m(x)) if affine else (lambda m, x: F.layer_norm(x, x.shape[-1:], eps=m.eps))  # noqa: E731
        if self.ln_b is not None:
            enc = ln(self.ln_b, enc)
        if self.config.embedding_ln_type == "INIT":  # normalized before averaging: positions can weigh unevenly
            E = ln(self.ln_a, E)
        avg = self.aggregate(E)  # (B, T, C)
        if self.config.embedding_ln_type == "AVG_CUM_SUM":
            avg = ln(self.ln_a, avg)
        return avg, enc

    def aggregate(self, E):
        """avg (B, T, C): the cumulative mean of E for MEAN; for LEARNED, avg[t] = sum over s <= t of W[t, s] E[s]."""
        T = E.size(1)
        if self.config.embedding_agg_type == "LEARNED":
            L = self.config.context_size
            # (L, L), zero above the diagonal by construction: only the packed s <= t entries are written
            W = E.new_zeros(L, L).index_put(tuple(self.embedding_agg_index), self.embedding_agg.to(E.dtype))
            return W[:T, :T] @ E  # (T, T) @ (B, T, C) -> (B, T, C)
        return cumsum_time(E) / torch.arange(1, T + 1, device=E.device, dtype=E.dtype).view(1, T, 1)

    def embedding_distance(self, avg, target):
        """The embedding loss: MSE, or the mean over positions of 1 - (cos + 1) / 2 or of -log((cos + 1) / 2)."""
        if self.config.embedding_loss_type == "MSE":
            return F.mse_loss(avg, target)
        cos = F.cosine_similarity(avg, target, dim=-1)  # (B, T)
        if self.config.embedding_loss_type == "COSINE":
            return (1 - (cos + 1) / 2).mean()
        return -torch.log((cos + 1) / 2).mean()  # LOG_COSINE

    @torch.no_grad()
    def embedding_loss_diagnostics(self, idx):
        """What tells an embedding loss that teaches the embeddings from one that collapsed (its LayerNorms'
        weights at 0: docs/model.md), on tokens idx (B, T) without dropout."""
        was_training = self.training
        _, E, enc = self.eval().hidden_states(idx)
        self.train(was_training)
        (avg, target), (avg0, target0) = (self.embedding_pair(E.float(), enc.float(), aff) for aff in (True, False))
        w = [getattr(ln, "weight", None) for ln in (self.ln_a, self.ln_b)]
        wa, wb = (None if x is None else x.float().pow(2).mean().sqrt().item() for x in w)  # RMS
        return {"loss": self.embedding_distance(avg, target).item(),
                "loss_no_affine": self.embedding_distance(avg0, target0).item(),
                "ln_a_weight_rms": wa, "ln_b_weight_rms": wb,
                "cos_no_affine": F.cosine_similarity(avg0, target0, dim=-1).mean().item()}

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW, weight decay on matrices and embeddings (dim >= 2) only; fused on CUDA and CPU (~10x faster there)."""
        groups = [{"params": [p for p in self.parameters() if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in self.parameters() if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type in ("cuda", "cpu"))

    # generation, with a KV cache (docs/model.md, Generation with a KV cache)
    def new_kv_cache(self):
        return KVCache(len(self.attention_layers), self.config.context_size)

    def last_logits(self, idx, cache, pos):
        """Logits (B, vocab_size) of the token after idx (B, T) at positions pos (T,), run against cache."""
        return self.head(self.hidden_states(idx, cache, pos)[0][:, -1, :])  # only the last position: (B, C)

    def compile_decode_step(self, **compile_kwargs):
        """torch.compile next_logits' one-token cached steps, once for all positions (fixed shapes), fusing many ops."""
        self.compiled_decode_step = torch.compile(self.last_logits, dynamic=False, fullgraph=True, **compile_kwargs)

    @torch.no_grad()
    def next_logits(self, idx, cache=None):
        """Logits (B, vocab_size) of the token after idx (B, T), from its last context_size tokens; with a cache, only
        the tokens after its cache.pos are run (past context_size every position moves: the cache is refilled)."""
        window = idx[:, -self.config.context_size:]
        if cache is None:
            return self.last_logits(window, None, None)
        if idx.size(1) > self.config.context_size:
            cache.pos, new = 0, window
        else:  # a copy with its own strides: a view into the growing idx would bring a new stride (a recompile)
            new = idx[:, cache.pos:].clone(memory_format=torch.contiguous_format)  # at every step
        pos = torch.arange(cache.pos, cache.pos + new.size(1), device=idx.device)  # (T,)
        # the first call fills (and allocates) the cache; after that, single tokens may take the compiled step
        compiled = new.size(1) == 1 and cache.pos > 0 and self.compiled_decode_step is not None
        logits = (self.compiled_decode_step if compiled else self.last_logits)(new, cache, pos)
        cache.pos += new.size(1)
        return logits

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, kv_cache=True, on_token=lambda t: None):
        """Sample max_new_tokens tokens after idx (B, T), each also to on_token; temperature 0 is greedy."""
        cache = self.new_kv_cache() if kv_cache else None
        for _ in range(max_new_tokens):
            logits = self.next_logits(idx, cache)  # (B, vocab_size)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            if temperature == 0:
                idx_next = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:  # inverse-CDF sampling: the same distribution as torch.multinomial, at a tenth of its cost
                cdf = F.softmax(logits / temperature, dim=-1).cumsum(dim=-1)  # (B, vocab_size)
                u = torch.rand(cdf.size(0), 1, device=cdf.device) * cdf[:, -1:]  # (B, 1), in [0, total)
                idx_next = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.size(-1) - 1)  # skips p = 0
            on_token(idx_next)  # (B, 1), e.g. to print it as it comes
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


def build_model(config):
    return Transformer(config)


# x.cumsum(dim=1), kept in torch.compile's graph as eager's ATen kernel (Inductor's own failed on CUDA: docs/gpu.md)
@torch.library.custom_op("aed::cumsum_time", mutates_args=())
def cumsum_time(x: torch.Tensor) -> torch.Tensor:
    return x.cumsum(dim=1)


cumsum_time.register_fake(lambda x: torch.empty_like(x))
cumsum_time.register_autograd(lambda ctx, grad: cumsum_time(grad.flip(1)).flip(1))  # ATen's cumsum backward
