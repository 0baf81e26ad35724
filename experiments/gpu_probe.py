"""
train.py under a probe, for experiments/gpu_train_step.sh: python experiments/gpu_probe.py WAY
[OUT_JSON] -- train.py ARGS... WAY is one of
  inductor  train.py as it is
  aten      wte(idx) as a custom operator (as model.cumsum_time), which torch.compile keeps as calls
            to ATen's kernels: its backward sorts the ids and sums each id's rows once, where
            Inductor's own code adds each token's gradient into its row with atomics
  profile   train.py as it is, with torch.profiler over steps 14-16 (a step ends at train.py's
            torch.cuda.synchronize): GPU busy share, idle gaps and the kernels, into OUT_JSON
  nocudnn   cuDNN's attention off: scaled_dot_product_attention takes another of its kernels
  shapepad  Inductor pads every GEMM's sizes to aligned ones (force_shape_pad: the AED's width 150)
  fused     the training loss's head and cross-entropy in chunks of rows, each chunk's logits made
            again in the backward (checkpoint): the logits are never all in memory. At most
            PROBE_LOSS_CHUNK logits a chunk (default 2^27: 512 MiB in fp32)
"""
import json
import os
import runpy
import sys
import tempfile

WAYS = ("inductor", "aten", "profile", "nocudnn", "shapepad", "fused")
head = sys.argv[1:sys.argv.index("--")] if "--" in sys.argv else []
if not 1 <= len(head) <= 2 or head[0] not in WAYS or head[0] == "profile" and len(head) < 2:
    sys.exit(f"usage: python experiments/gpu_probe.py WAY [OUT_JSON] -- train.py ARGS... (WAY: one "
             f"of {', '.join(WAYS)}; profile needs OUT_JSON)")  # at once, before importing torch

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

way, out_json = head[0], head[1] if len(head) > 1 else None
sys.argv = sys.argv[sys.argv.index("--") + 1:]
sys.path.insert(0, os.getcwd())  # train.py's own imports

if way == "aten":
    @torch.library.custom_op("probe::embed", mutates_args=())
    def embed(idx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.embedding(idx, weight)

    @torch.library.custom_op("probe::embed_backward", mutates_args=())
    def embed_backward(grad: torch.Tensor, idx: torch.Tensor, n: int) -> torch.Tensor:
        return torch.ops.aten.embedding_dense_backward(grad, idx, n, -1, False)

    embed.register_fake(lambda idx, w: w.new_empty(*idx.shape, w.size(1)))
    embed_backward.register_fake(lambda grad, idx, n: grad.new_empty(n, grad.size(-1)))

    def keep(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.n = inputs[1].size(0)

    embed.register_autograd(lambda ctx, g: (None, embed_backward(g, *ctx.saved_tensors, ctx.n)),
                            setup_context=keep)
    # the op bound as a default: run_path swaps __main__, where Dynamo would look a global up
    torch.nn.Embedding.forward = lambda self, idx, op=embed: op(idx, self.weight)


def summarize(prof):
    """Per profiled step: its time, the GPU's busy share, the 5 longest idle gaps, top kernels."""
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(os.path.join(tmp, "trace.json"))
        with open(os.path.join(tmp, "trace.json")) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    kernels = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                     key=lambda e: e["ts"])
    steps = []
    for w in (e for e in events if e["name"].startswith("ProfilerStep#")):
        w0, w1 = w["ts"], w["ts"] + w["dur"]
        inside = [e for e in kernels if w0 <= e["ts"] < w1]
        busy, end, gaps, by_name = 0.0, w0, [], {}
        for e in inside:
            if e["ts"] > end:
                gaps.append((round((end - w0) / 1e3, 2), round((e["ts"] - end) / 1e3, 3)))
            busy += max(0.0, e["ts"] + e["dur"] - max(e["ts"], end))
            end = max(end, e["ts"] + e["dur"])
            by_name[e["name"][:90]] = by_name.get(e["name"][:90], 0.0) + e["dur"] / 1e3
        top = sorted(by_name.items(), key=lambda kv: -kv[1])[:15]
        steps.append({"step": w["name"], "ms": w["dur"] / 1e3, "busy_share": busy / w["dur"],
                      "kernels": len(inside), "kernel_ms": sum(by_name.values()),
                      "longest_gaps_at_ms_for_ms": sorted(gaps, key=lambda g: -g[1])[:5],
                      "top_kernels_ms": [[n, round(t, 3)] for n, t in top]})
    with open(out_json, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                   "steps": steps}, f, indent=1)


if way == "fused":
    from torch.utils.checkpoint import checkpoint
    import model
    forward, chunk = model.Transformer.forward, int(os.environ.get("PROBE_LOSS_CHUNK", 2 ** 27))

    def chunk_ce(self, out, targets):  # out: (N, C), targets: (N,) -> the summed cross-entropy
        return F.cross_entropy(self.head(out), targets, reduction="sum")

    def fused_forward(self, idx, targets=None, return_logits=True):
        """model.py's forward when it returns the loss alone (train.py's step and estimates)."""
        if targets is None or return_logits:
            return forward(self, idx, targets, return_logits)
        c = self.config
        out, E, enc = self.hidden_states(idx)
        rows, ce = max(1, chunk // c.vocab_size), 0.0
        for o, t in zip(out.flatten(0, 1).split(rows), targets.view(-1).split(rows)):
            ce = ce + checkpoint(chunk_ce, self, o, t, use_reentrant=False)
        ce = ce / targets.numel()
        loss, parts = ce, {"ce": ce.detach()}
        if self.training and c.embedding_loss_type != "NONE":  # as model.py's forward
            emb = self.embedding_distance(*self.embedding_pair(E, enc))
            loss = ce + c.embedding_loss_coeff * emb
            parts["emb"] = emb.detach()
        return None, loss, parts

    model.Transformer.forward = fused_forward
if way == "nocudnn":
    torch.backends.cuda.enable_cudnn_sdp(False)
if way == "shapepad":
    torch._inductor.config.force_shape_pad = True
if way == "profile":
    from torch.profiler import ProfilerActivity, profile, schedule
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                   schedule=schedule(wait=12, warmup=1, active=3), on_trace_ready=summarize)
    prof.start()
    synchronize = torch.cuda.synchronize

    def synchronize_and_step(*args):
        synchronize(*args)
        prof.step()

    torch.cuda.synchronize = synchronize_and_step
runpy.run_path("train.py", run_name="__main__")
