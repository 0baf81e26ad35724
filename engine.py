"""
Generation from a model.py Transformer (docs/model.md, Generation with a KV cache): with a KV cache
only the new tokens run, their attention reading the keys and values cached for the earlier ones
(Attention stores them through KVCache.update); without one each step reruns the window.
"""
import torch
from torch.nn import functional as F


class KVCache:
    """Each attention layer's keys and values in buffers of context_size slots, pos filled."""

    def __init__(self, model):
        self.context_size, self.pos = model.config.context_size, 0
        self.k, self.v = {}, {}  # an attention layer's buffers, by the layer

    def update(self, layer, pos, k, v):
        """layer's buffers of keys and values (B, nh, context_size, hs), once k, v (B, nh, T, hs)
        are in them at pos (T,)."""
        for buffers, new in ((self.k, k), (self.v, v)):
            if layer not in buffers:  # zeros: a masked slot weighs 0, but 0 * NaN is NaN
                buffers[layer] = new.new_zeros(*new.shape[:2], self.context_size, new.size(3))
            buffers[layer].index_copy_(2, pos, new)
        return self.k[layer], self.v[layer]


class Engine:
    """Generation from model: next_logits (with a KVCache or without), and generate, which samples
    from them. compile=True: the one-token cached step runs torch.compile'd, compiled once for all
    positions (fixed shapes)."""

    def __init__(self, model, compile=False):
        self.model, self.compiled_step = model, None
        if compile:
            self.compiled_step = torch.compile(self.last_logits, dynamic=False, fullgraph=True)

    def last_logits(self, idx, cache, pos):
        """Logits (B, vocab_size) of the token after idx (B, T) at pos (T,), against cache."""
        return self.model.head(self.model.hidden_states(idx, cache, pos)[0][:, -1, :])

    @torch.no_grad()
    def next_logits(self, idx, cache=None):
        """Logits (B, vocab_size) of the token after idx (B, T), from its last context_size tokens;
        with a cache, only the tokens after cache.pos run (past context_size: refilled)."""
        window = idx[:, -self.model.config.context_size:]
        if cache is None:
            return self.last_logits(window, None, None)
        if window.size(1) < idx.size(1):  # the window slid: every position moved
            cache.pos = 0  # refill from slot 0
        # a copy: a view into the growing idx would bring a new stride (a recompile)
        new = window[:, cache.pos:].clone(memory_format=torch.contiguous_format)
        pos = torch.arange(cache.pos, cache.pos + new.size(1), device=idx.device)
        step = self.last_logits
        # the first call fills (allocates) the cache; then single tokens may take the compiled step
        if new.size(1) == 1 and cache.pos > 0 and self.compiled_step:
            step = self.compiled_step
        cache.pos += new.size(1)  # the slots filled once this step is done
        return step(new, cache, pos)

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, kv_cache=True,
                 on_token=lambda t: None):
        """Sample max_new_tokens tokens after idx (B, T) (temperature 0: the argmax), each also to
        on_token."""
        cache = KVCache(self.model) if kv_cache else None
        for _ in range(max_new_tokens):
            logits = self.next_logits(idx, cache)  # (B, vocab_size)
            if top_k is not None:
                v = torch.topk(logits, min(top_k, logits.size(-1))).values
                logits[logits < v[:, [-1]]] = -float("inf")
            if temperature == 0:
                idx_next = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:  # inverse-CDF sampling: torch.multinomial's distribution at a tenth of its cost
                cdf = F.softmax(logits / temperature, dim=-1).cumsum(dim=-1)
                u = torch.rand(cdf.size(0), 1, device=cdf.device) * cdf[:, -1:]  # in [0, total)
                # the first token whose cumulative probability passes u (clamped: in float, u may
                # round up to the total); test_model.py checks the distribution
                idx_next = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.size(-1) - 1)
            on_token(idx_next)  # (B, 1), e.g. to print it as it comes
            idx = torch.cat((idx, idx_next), dim=1)
        return idx
