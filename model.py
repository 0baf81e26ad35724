"""
The auto-regressive encoder-decoder transformer (AED) and the decoder-only GPT baseline it is compared
to, in one file. Both share the attention, MLP and block code. SPEC.md is the specification.

GPT:  tokens -> wte + wpe -> n_layer causal blocks -> ln_f [-> minus wpe of the next positions] -> tied head
AED:  tokens -> wte + wpe = E -> n_layer causal blocks (encoder) = enc
      enc -> Linear -> n_decoder_layer decoder blocks (causal self-attention, causal cross-attention to enc, MLP)
      -> ln_f -> minus wpe of the next positions -> tied head
      (+ in training, an "embedding loss" between the cumulative mean of E, or a learned causal weighting of
      E, and enc)

Beyond the author (SPEC §6), each one key away and off by default:
- n_decoder_layer: n_layer encoder blocks, then n_decoder_layer decoder blocks (None: n_layer, the author's
  model). Each residual stream's output projections are scaled by its own depth: encoder
  N(0, 0.02 / sqrt(2 * n_layer)), decoder N(0, 0.02 / sqrt(2 * n_decoder_layer)); with equal depths both are
  SPEC §1's 0.02 / sqrt(2 * n_layer). The decoder stream starts afresh at the bridge, so it is its own sum of
  residual outputs, the sum GPT-2's scaling keeps in check.
- sub_pos_embed_to_decoder on arch='gpt': out = ln_f(x) - wpe[1..T] (then ln_post for YES_LN) before the
  tied head; wpe then has context_size + 1 rows, not counted.
- embedding_agg_type='LEARNED': avg[t] = sum over s <= t of W[t, s] * E'[s], with W learned and initialised
  to the cumulative mean (W[t, s] = 1 / (t + 1)), in place of the cumulative mean (see Transformer.aggregate).
"""

import math
import typing
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
from torch.nn import functional as F

ENUMS = {
    "arch": ("gpt", "aed"),
    "order_type": ("ORIGINAL", "ALT"),
    "sub_pos_embed_to_decoder": ("NO", "YES_NO_LN", "YES_LN"),
    "embedding_loss_type": ("NONE", "MSE", "COSINE", "LOG_COSINE"),
    "detach_type": ("ENCODER_OUT", "EMBEDDING", "NONE"),
    "embedding_ln_type": ("INIT", "AVG_CUM_SUM", "NONE"),
    "embedding_agg_type": ("MEAN", "LEARNED"),
}
# the embedding-loss options, and what None means for each when the loss is on
EMBEDDING_LOSS_DEFAULTS = {
    "embedding_loss_coeff": 1.0,
    "detach_type": "ENCODER_OUT",
    "embedding_ln_type": "INIT",
    "use_ln_on_encoder_out": True,
    "embedding_agg_type": "MEAN",
    "embedding_ln_affine": True,
}


@dataclass
class ModelConfig:
    arch: str = "aed"  # "gpt" (decoder-only baseline) or "aed"
    vocab_size: int = 50257  # GPT-2's BPE vocabulary
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
    # False: the loss's LayerNorms have no learned weight and bias, so the loss cannot reach 0 by shrinking
    # their weights and matching their biases (the way the author's loss collapses)
    embedding_ln_affine: typing.Optional[bool] = None

    def __post_init__(self):
        for f in fields(self):
            value, allowed = getattr(self, f.name), typing.get_args(f.type) or (f.type,)
            if type(value) is int and float in allowed:
                value = float(value)
                setattr(self, f.name, value)
            if type(value) not in allowed:  # type(), not isinstance: True is not an int here
                names = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
                raise ValueError(f"{f.name} must be {names}, got {value!r}")
            if f.name in ENUMS and value is not None and value not in ENUMS[f.name]:
                raise ValueError(f"{f.name} must be one of {', '.join(ENUMS[f.name])}, got {value!r}")
        for name in ("vocab_size", "context_size", "n_embed", "n_layer", "n_head"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
        if self.n_embed % self.n_head:
            raise ValueError(f"n_embed ({self.n_embed}) must be divisible by n_head ({self.n_head})")
        if self.arch == "gpt":
            for f in fields(self):
                if f.name in AED_ONLY and getattr(self, f.name) != f.default:
                    raise ValueError(f"{f.name} is an AED option: it must stay {f.default!r} when arch is 'gpt'")
            return
        if self.n_decoder_layer is None:
            self.n_decoder_layer = self.n_layer
        if self.n_decoder_layer < 1:
            raise ValueError(f"n_decoder_layer must be >= 1 (or None for n_layer), got {self.n_decoder_layer}")
        if self.cross_attn_n_head is None:
            self.cross_attn_n_head = 2 * self.n_head
        if self.cross_attn_n_head < 1 or self.n_embed % self.cross_attn_n_head:
            raise ValueError(f"n_embed ({self.n_embed}) must be divisible by cross_attn_n_head ({self.cross_attn_n_head})")
        if self.cross_attn_use_bias is None:
            self.cross_attn_use_bias = self.use_bias
        for name, default in EMBEDDING_LOSS_DEFAULTS.items():
            if self.embedding_loss_type == "NONE" and getattr(self, name) is not None:
                raise ValueError(f"{name} is set but embedding_loss_type is NONE")
            if self.embedding_loss_type != "NONE" and getattr(self, name) is None:
                setattr(self, name, default)


AED_ONLY = ("n_decoder_layer", "cross_attn_n_head", "cross_attn_use_bias", "order_type", "add_ln_before_decoder_ff",
            "add_pos_embed_to_decoder", "embedding_loss_type") + tuple(EMBEDDING_LOSS_DEFAULTS)


class Attention(nn.Module):
    """Multi-head causal attention. Self-attention takes q, k, v from x through one fused Linear; cross-attention
    (AED decoder) takes q from x and k, v from the encoder output. Both are causal: position t sees keys <= t
    (for cross-attention anything later would leak the target, since encoder position t+1 has read token t+1)."""

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
        # x: (B, T, C); enc: (B, T, C) encoder output (layer-normed), cross-attention only;
        # with a KVCache, pos: (T,) the positions of the T tokens, where their keys and values go in the cache
        B, T, C = x.size()
        if self.cross:
            q, (k, v) = self.q_proj(x), self.kv_proj(enc).split(C, dim=2)
        else:
            q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        dropout_p = self.dropout_rate if self.training else 0.0  # the author's code also dropped out in eval
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        else:  # k, v: (B, nh, context_size, hs), every cached key; mask: (T, context_size), which each query sees
            k, v, mask = cache.update(self.layer_idx, pos, k, v)
            # written out rather than SDPA: for a few queries on CPU, SDPA's kernel costs ~100 us a call, while
            # torch.compile fuses these ops into the step (the same math; dropout is off when generating)
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

    def __init__(self, config, cross_attn=False):
        super().__init__()
        C, bias = config.n_embed, config.use_bias
        self.ln_1 = nn.LayerNorm(C, bias=bias)
        self.attn = Attention(C, config.n_head, bias, config.dropout_rate)
        if cross_attn:
            self.ln_q = nn.LayerNorm(C, bias=bias)
            self.ln_kv = nn.LayerNorm(C, bias=bias)  # each decoder block normalizes enc its own way
            self.cross_attn = Attention(C, config.cross_attn_n_head, config.cross_attn_use_bias, config.dropout_rate, cross=True)
            self.cross_first = config.order_type == "ALT"
        self.ln_2 = nn.LayerNorm(C, bias=bias)
        self.mlp = MLP(config)

    def forward(self, x, enc=None, cache=None, pos=None):
        if enc is not None and self.cross_first:
            x = x + self.cross_attn(self.ln_q(x), self.ln_kv(enc), cache, pos)
        x = x + self.attn(self.ln_1(x), cache=cache, pos=pos)
        if enc is not None and not self.cross_first:
            x = x + self.cross_attn(self.ln_q(x), self.ln_kv(enc), cache, pos)
        return x + self.mlp(self.ln_2(x))


class KVCache:
    """Keys and values of every attention layer (encoder self, decoder self, decoder cross) of one batch of
    sequences, in buffers of context_size positions; pos of them are filled. Because every part of the AED is
    causal, appending a token changes nothing at earlier positions: a step only writes the new positions. The
    buffers never change shape, so one compiled decode step serves every position (compile_decode_step)."""

    def __init__(self, n_layers, context_size):
        self.k, self.v = [None] * n_layers, [None] * n_layers
        self.context_size, self.pos = context_size, 0

    def update(self, layer_idx, pos, k, v):
        # k, v: (B, nh, T, hs) of the tokens at positions pos (T,). Returns the whole buffers (B, nh, context_size,
        # hs) and the mask (T, context_size) of the slots each new query may see: those at or before its own position
        if self.k[layer_idx] is None:  # zeros, not empty: a masked slot gets weight 0, and 0 * NaN garbage is NaN
            B, nh, _, hs = k.shape
            self.k[layer_idx] = k.new_zeros(B, nh, self.context_size, hs)
            self.v[layer_idx] = v.new_zeros(B, nh, self.context_size, hs)
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
        # the positional add (AED) and subtraction (both archs) use wpe[1..T], one row past the context
        shift_pos = (aed and c.add_pos_embed_to_decoder) or c.sub_pos_embed_to_decoder != "NO"
        self.wte = nn.Embedding(c.vocab_size, C)  # tied to the output head: logits = out @ wte.weight.T
        self.wpe = nn.Embedding(c.context_size + 1 if shift_pos else c.context_size, C)
        self.drop = nn.Dropout(c.dropout_rate)
        self.blocks = nn.ModuleList([Block(c) for _ in range(c.n_layer)])  # GPT: all of it; AED: the encoder
        self.decoder_blocks = None
        if aed:
            self.ln_bridge = nn.LayerNorm(C, bias=c.use_bias) if c.add_ln_before_decoder_ff else None
            self.bridge = nn.Linear(C, C, bias=c.use_bias)  # "the linear pass" from encoder to decoder
            self.decoder_blocks = nn.ModuleList([Block(c, cross_attn=True) for _ in range(c.n_decoder_layer)])
        # made here, between the AED's decoder and its loss LayerNorms, where it has always been: a saved optimizer
        # state follows the order of the parameters
        self.ln_post = nn.LayerNorm(C, bias=c.use_bias) if c.sub_pos_embed_to_decoder == "YES_LN" else None
        if aed:
            on = c.embedding_loss_type != "NONE"  # the loss's LayerNorms always have a bias; no loss, no LayerNorms
            affine = bool(c.embedding_ln_affine)
            self.ln_a = nn.LayerNorm(C, elementwise_affine=affine) if on and c.embedding_ln_type != "NONE" else None
            self.ln_b = nn.LayerNorm(C, elementwise_affine=affine) if on and c.use_ln_on_encoder_out else None
            if c.embedding_agg_type == "LEARNED":
                # W[t, s] for s <= t only, packed row by row: (0,0), (1,0), (1,1), (2,0), ... There is no entry
                # for s > t at all, so position t mixes E'[0..t] whatever values training gives the weights.
                # Cost: context_size * (context_size + 1) / 2 parameters (20,100 at context 200), counted in
                # get_num_params like ln_a and ln_b (training-only parameters the author counts too). Being 1-D
                # it gets no weight decay: decay would pull the weights to 0, shrinking the average, not towards
                # the cumulative mean they start from.
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
        self.last_ce, self.last_embedding_loss = None, None
        self.compiled_decode_step = None  # see compile_decode_step

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def get_num_params(self):
        """All parameters (the tied wte counted once) minus the position embedding, as the author reports."""
        return sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()

    def flops_per_token(self):
        """Training FLOPs per token (forward + backward) at T = context_size, as in the PaLM paper / nanoGPT:
        6 per parameter plus 12 * T * C per attention layer (AED: encoder self, decoder self and cross)."""
        c = self.config
        return 6 * self.get_num_params() + 12 * len(self.attention_layers) * c.n_embed * c.context_size

    def hidden_states(self, idx, cache=None, pos=None):
        """The final hidden states (B, T, C), just before the tied head, of tokens idx (B, T) at positions pos (T,),
        0..T-1 unless given; with a KVCache their keys and values are written to it at pos, and attention reads
        every cached position up to its own. Also returns E and enc for the embedding loss."""
        c = self.config
        B, T = idx.size()
        if pos is None:
            if T > c.context_size:
                raise ValueError(f"sequence length {T} is longer than context_size {c.context_size}")
            pos = torch.arange(T, dtype=torch.long, device=idx.device)  # (T,)
        E = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        x = E
        for block in self.blocks:
            x = block(x, cache=cache, pos=pos)
        enc = None
        if self.decoder_blocks is not None:
            enc = x  # (B, T, C), no final LayerNorm
            x = self.bridge(enc if self.ln_bridge is None else self.ln_bridge(enc))
            if c.add_pos_embed_to_decoder:
                # in place, as the author's code: under autocast the stream keeps the bridge's dtype (bf16) instead
                # of being promoted to fp32 by the fp32 wpe (the sum is rounded once, to bf16); in fp32/fp64 no
                # difference
                x += self.wpe(pos + 1)
            for block in self.decoder_blocks:
                x = block(x, enc=enc, cache=cache, pos=pos)
        out = self.ln_f(x)
        if c.sub_pos_embed_to_decoder != "NO":  # remove the position of the token being predicted, t + 1
            out = out - self.wpe(pos + 1)
            if self.ln_post is not None:
                out = self.ln_post(out)
        return out, E, enc

    def embedding_loss(self, E, enc):
        """Disaffinity between the cumulative mean of the input embeddings E and the encoder output enc."""
        c = self.config
        if c.detach_type == "ENCODER_OUT":  # train only the embeddings (and the loss's LayerNorms)
            enc = enc.detach()
        elif c.detach_type == "EMBEDDING":
            E = E.detach()
        return self.embedding_distance(*self.embedding_pair(E, enc))

    def embedding_pair(self, E, enc, affine=True):
        """The two sides of the embedding loss, (avg, target), each (B, T, C); affine=False leaves out the loss
        LayerNorms' learned weights and biases (for embedding_loss_diagnostics)."""
        c = self.config
        def ln(m, x):
            return m(x) if affine else F.layer_norm(x, x.shape[-1:], eps=m.eps)
        if self.ln_b is not None:
            enc = ln(self.ln_b, enc)
        if c.embedding_ln_type == "INIT":  # normalizing before averaging lets the model weight positions unevenly
            E = ln(self.ln_a, E)
        avg = self.aggregate(E)  # (B, T, C)
        if c.embedding_ln_type == "AVG_CUM_SUM":
            avg = ln(self.ln_a, avg)
        return avg, enc

    def embedding_distance(self, avg, target):
        if self.config.embedding_loss_type == "MSE":
            return F.mse_loss(avg, target)
        cos = F.cosine_similarity(avg, target, dim=-1)  # (B, T)
        if self.config.embedding_loss_type == "COSINE":
            return (1 - (cos + 1) / 2).mean()
        return -torch.log((cos + 1) / 2).mean()  # LOG_COSINE

    @torch.no_grad()
    def embedding_loss_diagnostics(self, idx):
        """What tells an embedding loss that teaches the embeddings from one that collapsed, on tokens idx (B, T)
        without dropout: the loss; the loss without the LayerNorms' learned weights and biases; the RMS of
        each LayerNorm's weight (1 at init) and of the gap between their biases (if both weights shrink to 0,
        the loss tends to the gap's square: a constant matches a constant); the spread of each side over the
        B * T positions (0: a constant); the mean cosine between the two sides without the affine parts."""
        was_training = self.training
        self.eval()
        _, E, enc = self.hidden_states(idx)
        self.train(was_training)
        E, enc = E.float(), enc.float()
        avg, target = self.embedding_pair(E, enc)
        avg0, target0 = self.embedding_pair(E, enc, affine=False)
        rms = lambda x: x.float().pow(2).mean().sqrt().item()  # noqa: E731
        spread = lambda x: x.reshape(-1, x.size(-1)).std(dim=0).mean().item()  # noqa: E731
        ln_a, ln_b = self.ln_a, self.ln_b
        has_a, has_b = ln_a is not None and ln_a.weight is not None, ln_b is not None and ln_b.weight is not None
        return {
            "loss": self.embedding_distance(avg, target).item(),
            "loss_no_affine": self.embedding_distance(avg0, target0).item(),
            "ln_a_weight_rms": rms(ln_a.weight) if has_a else None,
            "ln_b_weight_rms": rms(ln_b.weight) if has_b else None,
            "ln_bias_gap_rms": rms(ln_a.bias - ln_b.bias) if has_a and has_b else None,
            "avg_spread": spread(avg), "target_spread": spread(target),
            "cos_no_affine": F.cosine_similarity(avg0, target0, dim=-1).mean().item(),
        }

    def aggregate(self, E):
        """avg[t] from E (B, T, C): the cumulative mean (E[0] + ... + E[t]) / (t + 1) for MEAN, sum over s <= t of
        W[t, s] * E[s] for LEARNED (W starts as the cumulative mean's weights). Either way avg[t] sees E[0..t] only."""
        T = E.size(1)
        if self.config.embedding_agg_type == "LEARNED":
            L = self.config.context_size
            # (L, L), zero above the diagonal by construction: only the packed s <= t entries are written
            W = E.new_zeros(L, L).index_put(tuple(self.embedding_agg_index), self.embedding_agg.to(E.dtype))
            return W[:T, :T] @ E  # (T, T) @ (B, T, C) -> (B, T, C)
        return cumulative_mean(E)

    def forward(self, idx, targets=None, return_logits=True):
        """idx, targets: (B, T). Returns (logits (B, T, vocab_size) or None, loss or None). In training mode the
        loss is ce + embedding_loss_coeff * embedding loss, in eval mode ce alone; the parts of the last forward
        with targets are kept, detached, in self.last_ce and self.last_embedding_loss (None when not computed).
        With targets and return_logits=False the full logits are never built (see chunked_cross_entropy)."""
        c = self.config
        out, E, enc = self.hidden_states(idx)
        logits = None
        if targets is None or return_logits:
            logits = F.linear(out, self.wte.weight)  # (B, T, vocab_size)
        if targets is None:
            return logits, None
        if logits is not None:
            ce = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        else:
            ce = chunked_cross_entropy(out.view(-1, out.size(-1)), self.wte.weight, targets.view(-1))
        loss, emb = ce, None
        if self.training and enc is not None and c.embedding_loss_type != "NONE":
            emb = self.embedding_loss(E, enc)
            loss = ce + c.embedding_loss_coeff * emb
        self.last_ce = ce.detach()
        self.last_embedding_loss = None if emb is None else emb.detach()
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW with weight decay on matrices and embeddings (dim >= 2) only. Fused (one kernel for all
        parameters) on CUDA and on CPU, where it is ~10x faster than the default foreach loop; elsewhere the
        default."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type in ("cuda", "cpu"))

    def new_kv_cache(self):
        return KVCache(len(self.attention_layers), self.config.context_size)

    def last_logits(self, idx, cache, pos):
        """Logits (B, vocab_size) of the token after idx (B, T) at positions pos (T,), run against cache."""
        out, _, _ = self.hidden_states(idx, cache, pos)
        return F.linear(out[:, -1, :], self.wte.weight)  # only the last position goes through the head

    def compile_decode_step(self, **compile_kwargs):
        """Run the one-token cached steps of next_logits (all but the first) through torch.compile. The cache
        and position tensors keep their shapes, so one compilation serves every position; compiling fuses the
        hundreds of small per-token ops, whose overhead is a large part of an eager step on CPU."""
        self.compiled_decode_step = torch.compile(self.last_logits, dynamic=False, fullgraph=True, **compile_kwargs)

    @torch.no_grad()
    def next_logits(self, idx, cache=None):
        """Logits (B, vocab_size) of the token following idx (B, T), looking at the last context_size tokens.
        Without a cache it reruns the whole model (like nanoGPT). With one, idx must begin with the tokens the
        cache has already seen (cache.pos of them); only the rest are run, and they are appended to the cache.
        Past context_size the window slides: every token moves to a new position, so with absolute position
        embeddings no cached key or value stays valid. The cache is then emptied and refilled from the window,
        which gives exactly the sliding-window logits at the cost of an uncached step."""
        window = idx[:, -self.config.context_size:]
        if cache is None:
            return self.last_logits(window, None, None)
        if idx.size(1) > self.config.context_size:
            cache.pos, new = 0, window
        else:
            # a copy with its own strides: a view into the growing idx would have a new stride at every step, and
            # each new stride would make a compiled step recompile
            new = idx[:, cache.pos:].clone(memory_format=torch.contiguous_format)
        pos = torch.arange(cache.pos, cache.pos + new.size(1), device=idx.device)  # (T,)
        # the first call fills (and allocates) the cache; after that, single tokens may take the compiled step
        step = self.last_logits
        if new.size(1) == 1 and cache.pos > 0 and self.compiled_decode_step is not None:
            step = self.compiled_decode_step
        logits = step(new, cache, pos)
        cache.pos += new.size(1)
        return logits

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, kv_cache=True):
        """Sample max_new_tokens tokens after idx (B, T); temperature 0 means greedy. With kv_cache the
        logits are the same as without, only computed once per position (see next_logits)."""
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
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


@torch.compiler.disable  # Inductor's CUDA code for this cumsum fails to compile (torch 2.11, H100); eager costs ~nothing
def cumulative_mean(E):
    T = E.size(1)
    return E.cumsum(dim=1) / torch.arange(1, T + 1, device=E.device, dtype=E.dtype).view(1, T, 1)  # (B, T, C)


def build_model(config):
    return Transformer(config)


# rows per chunk so that one chunk's fp32 logits take at most 32 MB: small enough for glibc's malloc to
# reuse the memory instead of mapping fresh pages each time (page faults were 40% of a CPU step)
CHUNK_ELEMENTS = 8 * 1024 * 1024


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits = h @ w.T, computed a chunk of rows at a time so that the (N, V) logits
    never exist at once. The loss is a scalar, so its gradients are computed during the forward pass, chunk by
    chunk, and backward only scales them (the trick of fused linear + cross-entropy kernels)."""

    @staticmethod
    def forward(ctx, h, w, targets):
        loss, grad_h, grad_w = _chunked_cross_entropy(h, w, targets, with_grads=True)
        ctx.save_for_backward(grad_h, grad_w)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_loss, grad_w * grad_loss, None


def _chunked_cross_entropy(h, w, targets, with_grads):
    # h: (N, C) hidden states, w: (V, C) tied embedding, targets: (N,)
    N, V = h.size(0), w.size(0)
    chunk = max(1, CHUNK_ELEMENTS // V)
    dtype = torch.get_autocast_dtype(h.device.type) if torch.is_autocast_enabled(h.device.type) else h.dtype
    wd = w.to(dtype)
    loss = torch.zeros((), dtype=torch.float32, device=h.device)
    grad_h = torch.empty_like(h) if with_grads else None
    grad_w = torch.zeros_like(w, dtype=torch.float32) if with_grads else None
    for i in range(0, N, chunk):
        hc, tc = h[i:i + chunk].to(dtype), targets[i:i + chunk]
        logits = (hc @ wd.T).float()  # (n, V)
        target_logits = logits.gather(1, tc[:, None]).squeeze(1)  # (n,)
        max_logits = logits.amax(dim=1, keepdim=True)  # (n, 1)
        exp = logits.sub_(max_logits).exp_()  # in place, and only one exp pass: they dominate after the matmuls
        sum_exp = exp.sum(dim=1)  # (n,)
        loss += (max_logits.squeeze(1) + sum_exp.log() - target_logits).sum()
        if with_grads:  # d(sum of ce)/d logits = softmax - one_hot(target)
            grad = exp.div_(sum_exp[:, None])
            grad[torch.arange(grad.size(0), device=grad.device), tc] -= 1.0
            grad = grad.to(dtype)
            grad_h[i:i + chunk] = grad @ wd
            grad_w += grad.T @ hc
    if with_grads:
        return loss / N, grad_h / N, (grad_w / N).to(w.dtype)
    return loss / N, None, None


@torch.compiler.disable  # a Python loop of big matmuls: nothing for the compiler to fuse
def chunked_cross_entropy(h, w, targets):
    """Same value and gradients as F.cross_entropy(h @ w.T, targets), without the (N, V) logits in memory."""
    if torch.is_grad_enabled() and (h.requires_grad or w.requires_grad):
        return _ChunkedCrossEntropy.apply(h, w, targets)
    return _chunked_cross_entropy(h, w, targets, with_grads=False)[0]
