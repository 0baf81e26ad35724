"""bench.py's quick mode, end to end, so the benchmark cannot silently rot."""

import json
import os
import subprocess
import sys

import pytest
import torch

import bench
from model import ModelConfig, build_model

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
# one thread: these tests check what bench.py reports, not how fast; two threads on a machine whose
# other core is busy wait on each other at every small op (the quick bench went from about 5 min to
# about 1)
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def test_bench_quick(tmp_path):
    out = tmp_path / "bench.json"
    # the timeout only catches a hang
    p = subprocess.run([sys.executable, "bench.py", "--quick", f"--out_json={out}"], cwd=HERE,
                       capture_output=True, text=True, env=ENV, timeout=1800)
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert r["machine"]["threads"] >= 1 and r["matmul_peak_flops"] > 0
    runs = {row["run"]: row for row in r["train"]}
    assert {"ours, eager", "AED small eager", "GPT small eager"} <= set(runs)
    # the small pair's GPT is ours on nanoGPT's config: measured once, in the same interleaved group
    # as the AED
    assert runs["GPT small eager"]["ms_per_step"] == runs["ours, eager"]["ms_per_step"]
    assert set(r["section_seconds"]) == {"train", "generate", "data", "prepare", "memory"}
    for row in r["train"]:  # the figures follow from the step time, the FLOPs and the peak
        b, t = map(int, row["batch"].split("x"))
        assert row["tokens_per_s"] == pytest.approx(b * t / row["ms_per_step"] * 1000)
        assert row["share_of_matmul_peak"] == pytest.approx(
            row["flops_per_token"] * row["tokens_per_s"] / r["matmul_peak_flops"])
    # the small pair: the AED has more attention layers (2 x 3 vs 4), so more FLOPs
    pair = r["aed_vs_gpt"][0]
    assert pair["time_ratio_aed_over_gpt"] == pytest.approx(
        runs["AED small eager"]["ms_per_step"] / runs["GPT small eager"]["ms_per_step"])
    assert pair["flops_ratio_aed_over_gpt"] > 1
    assert {(g["model"], g["batch"]) for g in r["generate"]} == {("AED", 1), ("AED", 8),
                                                                 ("GPT", 1), ("GPT", 8)}
    assert all(g["ms_per_token_cached"] > 0 and g["ms_per_token_uncached"] > 0
               for g in r["generate"])
    assert all(g["ms_per_token_weight_read"] > 0 and g["speedup_bound"] == pytest.approx(
        g["ms_per_token_uncached"] / g["ms_per_token_weight_read"]) for g in r["generate"])
    # the KV cache size bench reports is what the model really allocates (quick mode: the small AED)
    aed = build_model(ModelConfig(**dict(bench.SMALL_AED, context_size=200))).eval()
    for g in (g for g in r["generate"] if g["model"] == "AED"):
        cache = aed.new_kv_cache()
        aed.next_logits(torch.zeros(g["batch"], 1, dtype=torch.long), cache)
        assert g["kv_cache_mb"] * 1e6 == pytest.approx(sum(t.numel() * t.element_size()
                                                           for t in cache.k + cache.v))
    assert 0 <= r["data"]["share"] < 1 and r["data"]["step_ms"] > 0
    assert r["prepare"]["prepare_mb_per_s"] > 0 and r["prepare"]["prepare_peak_rss_mb"] > 0
    assert all(m["step_mb"] > 0 for m in r["memory"])


def test_bench_bad_option():
    p = subprocess.run([sys.executable, "bench.py", "--quik=True"], cwd=HERE, capture_output=True,
                       text=True, env=ENV)
    assert p.returncode == 1 and "quick" in p.stderr and "Traceback" not in p.stderr


def test_uncached_lengths():
    """Uncached generation is timed at every 8th length; their mean is the mean of all 199 (a
    token's uncached cost is about linear in the length), so the figure stays the mean over the
    whole fill of the context."""
    lengths = bench.uncached_lengths(199)
    assert len(lengths) == 25 and sum(lengths) / 25 == sum(range(1, 200)) / 199
    assert lengths == sorted(set(lengths)) and 1 <= lengths[0] and lengths[-1] <= 199
    assert bench.uncached_lengths(5) == [1, 2, 3, 4, 5]


def test_bench_step_quick(tmp_path):
    """The step section, as a GPU run asks for it (--sections=step), on CPU in quick mode: the small
    AED, its 2 sequences a step in 2 micro-batches and in 1, each time the default and the vocab
    padded to 64 side by side (eager on CPU, so the graph-break variant, the same computation there,
    is left out)."""
    out = tmp_path / "bench.json"
    p = subprocess.run([sys.executable, "bench.py", "--quick", "--sections=step",
                        "--step_models=aed", f"--out_json={out}"], cwd=HERE, capture_output=True,
                       text=True, env=ENV, timeout=600)
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())["step"]
    assert [(r["micro_batches"], r["micro_batch"], r["variant"]) for r in rows] == [
        (2, "1x128", "eager"), (2, "1x128", "eager, vocab padded to 64"),
        (1, "2x128", "eager"), (1, "2x128", "eager, vocab padded to 64")]
    assert all(r["ms_per_step"] > 0 and r["tokens_per_s"] > 0 and r["first_step_s"] > 0
               for r in rows)
    assert len({r["params"] for r in rows}) == 1  # the padding rows are not counted


@pytest.mark.parametrize("args,words", [
    (["--micro_batches=3"], "micro_batches"),  # quick: 2 sequences a step
    (["--micro_batches=2,x"], "micro_batches"),
    (["--step_models=bert"], "step_models"),
    (["--sections=stepp"], "step"),
])
def test_bench_step_bad_option(args, words):
    p = subprocess.run([sys.executable, "bench.py", "--quick", "--sections=step", *args], cwd=HERE,
                       capture_output=True, text=True, env=ENV)
    assert p.returncode == 1 and words in p.stderr and "Traceback" not in p.stderr


def test_step_variants(monkeypatch):
    """Compiled, the AED's step is timed three ways (graph break at the cumulative mean, one graph,
    vocab padded), the GPT's two; the graph-break variant's model really breaks the graph there, and
    the default's does not."""
    assert list(bench.step_variants(bench.AUTHOR_AED, compiled=True)) == [
        "graph break at the cumulative mean", "one graph", "one graph, vocab padded to 64"]
    assert list(bench.step_variants(bench.AUTHOR_GPT, compiled=True)) == [
        "one graph", "one graph, vocab padded to 64"]
    assert bench.step_variants(bench.AUTHOR_AED, compiled=True)["one graph, vocab padded to 64"][0][
        "vocab_pad_multiple"] == 64
    monkeypatch.setattr(bench, "device", "cpu", raising=False)
    monkeypatch.setattr(bench, "device_type", "cpu", raising=False)
    kw = dict(bench.SMALL_AED, n_layer=1, vocab_size=64, context_size=16)
    x = torch.randint(0, 64, (2, 16))
    breaks = []
    for outside in (True, False):
        _, raw = bench.author_step_fn(kw, 2, 1, compiled=False, mean_outside_graph=outside)
        torch._dynamo.reset()
        breaks.append(torch._dynamo.explain(raw)(x, x).graph_break_count)
    assert breaks[0] >= 1 and breaks[1] == 0


def test_params_section_counts_every_config(tmp_path):
    """--sections=params: each config/ run's parameters, non-embedding parameters and FLOPs per
    token, as the model counts them (the author's counts for the key pair), without timing
    anything."""
    out = tmp_path / "bench.json"
    p = subprocess.run([sys.executable, "bench.py", "--sections=params", f"--out_json={out}"],
                       cwd=HERE, capture_output=True, text=True, env=ENV, timeout=600)
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    rows = {row["config"]: row for row in r["params"]}
    configs = {f for f in os.listdir(os.path.join(HERE, "config")) if not f.endswith("_common.py")}
    assert set(rows) == configs and "matmul_peak_flops" not in r
    assert (rows["aed_mse_possub.py"]["params"] == 15_763_500
            and rows["baseline.py"]["params"] == 16_036_800)
    aed = build_model(ModelConfig(arch="aed", n_layer=2, n_embed=96, n_head=4, cross_attn_n_head=8,
                                  context_size=128, embedding_loss_type="MSE",
                                  sub_pos_embed_to_decoder="YES_NO_LN", detach_type="ENCODER_OUT",
                                  embedding_ln_type="INIT", use_ln_on_encoder_out=True))
    row = rows["cpu_aed_mse_possub.py"]
    assert (row["params"], row["flops_per_token"]) == (aed.get_num_params(), aed.flops_per_token())
    assert row["non_embedding_params"] == aed.get_num_params() - 50257 * 96
    # the GPT widened to the AED preset's body: within 1% of it
    matched = rows["cpu_baseline_matched.py"]["non_embedding_params"]
    assert abs(matched / row["non_embedding_params"] - 1) < 0.01
