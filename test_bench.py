"""bench.py's quick mode, end to end, so the benchmark cannot silently rot."""

import json
import os
import subprocess
import sys

import pytest
import torch

import bench
from model import ModelConfig, build_model

HERE = os.path.dirname(os.path.abspath(__file__))


def test_bench_quick(tmp_path):
    out = tmp_path / "bench.json"
    p = subprocess.run([sys.executable, "bench.py", "--quick", f"--out_json={out}"], cwd=HERE,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert r["machine"]["threads"] >= 1 and r["matmul_peak_flops"] > 0
    runs = {row["run"]: row for row in r["train"]}
    assert {"nanoGPT-style step (full logits)", "ours, eager", "AED small eager", "GPT small eager"} <= set(runs)
    # the small pair's GPT is ours on nanoGPT's config: measured once, in the same interleaved group as the AED
    assert runs["GPT small eager"]["ms_per_step"] == runs["ours, eager"]["ms_per_step"]
    assert set(r["section_seconds"]) == {"train", "generate", "data", "prepare", "memory"}
    assert all(row["tokens_per_s"] > 0 and 0 < row["share_of_matmul_peak"] < 2 for row in r["train"])
    pair = r["aed_vs_gpt"][0]  # the small pair: the AED has more attention layers (2 x 3 vs 4), so more FLOPs
    assert pair["time_ratio_aed_over_gpt"] > 0 and pair["flops_ratio_aed_over_gpt"] > 1
    assert {(g["model"], g["batch"]) for g in r["generate"]} == {("AED", 1), ("AED", 8), ("GPT", 1), ("GPT", 8)}
    assert all(g["ms_per_token_cached"] > 0 and g["ms_per_token_uncached"] > 0 for g in r["generate"])
    assert all(0 < g["ms_per_token_weight_read"] and 1 < g["speedup_bound"] for g in r["generate"])
    # the KV cache size bench reports is what the model really allocates (quick mode: the small AED)
    aed = build_model(ModelConfig(**dict(bench.SMALL_AED, context_size=200))).eval()
    for g in (g for g in r["generate"] if g["model"] == "AED"):
        cache = aed.new_kv_cache()
        aed.next_logits(torch.zeros(g["batch"], 1, dtype=torch.long), cache)
        assert g["kv_cache_mb"] * 1e6 == pytest.approx(sum(t.numel() * t.element_size() for t in cache.k + cache.v))
    assert 0 <= r["data"]["share"] < 1 and r["data"]["step_ms"] > 0
    assert r["prepare"]["prepare_mb_per_s"] > 0 and r["prepare"]["prepare_peak_rss_mb"] > 0
    # the chunked loss must not need more memory than the full logits
    assert all(m["chunked_mb"] <= m["full_logits_mb"] for m in r["memory"])


def test_bench_bad_option():
    p = subprocess.run([sys.executable, "bench.py", "--quik=True"], cwd=HERE, capture_output=True, text=True)
    assert p.returncode == 1 and "quick" in p.stderr and "Traceback" not in p.stderr


def test_uncached_lengths():
    """Uncached generation is timed at every 8th length; their mean is the mean of all 199 (a token's uncached
    cost is about linear in the length), so the figure stays the mean over the whole fill of the context."""
    lengths = bench.uncached_lengths(199)
    assert len(lengths) == 25 and sum(lengths) / 25 == sum(range(1, 200)) / 199
    assert lengths == sorted(set(lengths)) and 1 <= lengths[0] and lengths[-1] <= 199
    assert bench.uncached_lengths(5) == [1, 2, 3, 4, 5]
