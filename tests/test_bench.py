"""bench.py's quick mode, end to end, so the benchmark cannot silently rot."""

import json
import os
import statistics
import subprocess
import sys

import pytest
import torch

import bench
from conftest import run_here
from engine import Engine, KVCache
from model import ModelConfig, Transformer

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
# one thread: these tests check what bench.py reports, not how fast; two threads on a machine whose
# other core is busy wait on each other at every small op (the quick bench went from about 5 min to
# about 1)
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def test_bench_quick(tmp_path):
    out = tmp_path / "bench.json"
    # the timeout only catches a hang
    # one timed run per measurement: the figures' plumbing is tested, not their noise
    p = subprocess.run([sys.executable, "bench.py", "--quick", "--repeats=1", f"--out_json={out}"],
                       cwd=HERE, capture_output=True, text=True, env=ENV, timeout=1800)
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
    aed = Transformer(ModelConfig(**dict(bench.SMALL_AED, context_size=64))).eval()
    assert {g["new_tokens"] for g in r["generate"]} == {63}  # quick: a context of 64
    for g in (g for g in r["generate"] if g["model"] == "AED"):
        cache = KVCache(aed)
        Engine(aed).next_logits(torch.zeros(g["batch"], 1, dtype=torch.long), cache)
        buffers = [*cache.k.values(), *cache.v.values()]
        assert g["kv_cache_mb"] * 1e6 == pytest.approx(sum(t.numel() * t.element_size()
                                                           for t in buffers))
    assert 0 <= r["data"]["share"] < 1 and r["data"]["step_ms"] > 0
    assert r["prepare"]["prepare_mb_per_s"] > 0 and r["prepare"]["prepare_peak_rss_mb"] > 0
    assert all(m["step_mb"] > 0 for m in r["memory"])


def test_bench_bad_option():
    """A mistyped option, in a real process: exit status 1, one line on stderr naming the option
    meant, nothing on stdout, no traceback (the other bad inputs run in this process)."""
    p = subprocess.run([sys.executable, "bench.py", "--quik=True"], cwd=HERE, capture_output=True,
                       text=True, env=ENV)
    assert p.returncode == 1 and p.stdout == "" and p.stderr.count("\n") == 1
    assert "quick" in p.stderr and "Traceback" not in p.stderr


BYTE_CONFIGS = ["config/bytes_baseline.py", "config/bytes_aed_mse_possub.py"]


def test_bench_config_files(tmp_path, monkeypatch):
    """Config files: each one's training step as train.py would take it (its batch, dtype, compile,
    split), interleaved; a row per config with its median, and the ratio to the first that the
    medians give. Tiny models: the plumbing is tested, not the figures (in this process)."""
    out = tmp_path / "bench.json"
    monkeypatch.chdir(HERE)  # the config files' paths are relative
    p = run_here("bench.py", *BYTE_CONFIGS, "--n_layer=1", "--n_embed=16", "--context_size=16",
                 "--batch_size=2", "--repeats=3", f"--out_json={out}")
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert set(r["section_seconds"]) == {"train"} and "train" not in r
    rows = r["train_configs"]
    assert [row["config"] for row in rows] == BYTE_CONFIGS
    assert [row["arch"] for row in rows] == ["gpt", "aed"]
    for row in rows:  # bytes_common.py's settings, the overrides on top
        assert (row["device"], row["dtype"], row["compile"], row["batch"], row["micro_steps"],
                row["steps"]) == ("cpu", "float32", "off", "2x16", 1, 3), row
        assert row["ms_q1"] <= row["ms_per_step"] <= row["ms_q3"] and len(row["ms_steps"]) == 3
        assert row["ms_per_step"] == pytest.approx(statistics.median(row["ms_steps"]), abs=1e-3)
        assert row["tokens_per_s"] == pytest.approx(2 * 16 / row["ms_per_step"] * 1000)
        assert row["ratio_to_first"] == pytest.approx(row["ms_per_step"] / rows[0]["ms_per_step"])
        assert row["config"] in p.stdout
    assert rows[0]["ratio_to_first"] == rows[0]["ratio_to_first_paired"] == 1.0
    # the paired ratio: the median of the rounds' ratios (the same round's steps)
    assert rows[1]["ratio_to_first_paired"] == pytest.approx(statistics.median(
        a / g for a, g in zip(rows[1]["ms_steps"], rows[0]["ms_steps"])), rel=1e-2)
    # the table's ratio columns are the JSON's
    line = next(x for x in p.stdout.splitlines() if BYTE_CONFIGS[1] in x)
    assert [float(x) for x in line.split()[-2:]] == pytest.approx(
        [rows[1]["ratio_to_first"], rows[1]["ratio_to_first_paired"]], abs=1e-3)


@pytest.mark.parametrize("args,words", [
    (["config/bytes_baselin.py"], "config file not found: config/bytes_baselin.py (did you mean"),
    (["config/bytes_baseline.py", "--n_layr=1"], "did you mean 'n_layer'"),
    (["--n_layer=1"], "give config files"),
    (["config/bytes_baseline.py", "--n_embed=15"], "divisible"),
])
def test_bench_config_files_bad_input(args, words, monkeypatch):
    monkeypatch.chdir(HERE)
    p = run_here("bench.py", *args)
    assert p.returncode == 1 and p.stdout == "", p.stdout
    assert p.stderr.count("\n") == 1 and words in p.stderr and "Traceback" not in p.stderr


def test_uncached_lengths():
    """Uncached generation is timed at every 8th length; their mean is the mean of all 199 (a
    token's uncached cost is about linear in the length), so the figure stays the mean over the
    whole fill of the context."""
    lengths = bench.uncached_lengths(199)
    assert len(lengths) == 25 and sum(lengths) / 25 == sum(range(1, 200)) / 199
    assert lengths == sorted(set(lengths)) and 1 <= lengths[0] and lengths[-1] <= 199
    assert bench.uncached_lengths(5) == [1, 2, 3, 4, 5]


def test_kernel_kinds_of_an_h200_profile():
    """Kernel names from a profile of the author's GPT step on an H200 (experiments/
    gpu_h200_train_step.md) fall in their kinds: cuDNN's attention is not a GEMM for its sm90_."""
    names = {"cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1":
             "attention",
             "void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_256x128_nt_align1>":
             "gemm", "nvjet_sm90_tst_160x192_64x3_1x4_h_bz_coopB_NNN": "gemm",
             "triton_red_fused__log_softmax__log_softmax_backward_data__to_copy": "triton",
             "void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>": "optimizer",
             "Memset (Device)": "memcpy/memset", "void at::native::vectorized_elementwise": "other"}
    assert {n: bench.kernel_kind(n) for n in names} == names


def check_step_row(row):
    """A dry step row: finite gradients, equal to its model's reference step (float32 on CPU: the
    accumulation and the split change only rounding), its tokens/s from its time, a profile."""
    assert row["grad_ok"] and row["grad_finite"], row
    assert row.get("grad_reference") or row["grad_rel_err"] < 1e-5, row
    assert row["tokens_per_s"] == pytest.approx(16 * 16 / row["ms_per_step"] * 1000)
    prof = row["profile"]
    assert 0 < prof["busy_share"] <= 1 and prof["kernels_per_micro_batch"] > 0, prof
    assert prof["host_us_per_launch"] > 0 and prof["ms_by_kind"], prof


def test_bench_step_dry(tmp_path, monkeypatch):
    """--sections=step --dry --step_models=gpt: the GPU flow on CPU with a 2-block GPT, each of its
    variants of STEP_PLAN in that order: the first compiled while 3 children (real processes)
    compile later ones, its step as it was the gradient reference, every other variant's gradients
    equal to it, a profile summary for each. The flow runs in this process (the AED's variants:
    test_bench_step_gradient_check_marks_a_wrong_variant)."""
    out = tmp_path / "bench.json"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the children's
    p = run_here("bench.py", "--sections=step", "--dry", "--step_steps=1", "--step_models=gpt",
                 f"--out_json={out}")
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    rows = r["step"]
    assert [row["variant"] for row in rows] == [
        f"{m} {n}x{16 // n} {mode}" + (" .backward()" if acc == "backward" else "")
        for m, n, mode, acc in bench.STEP_PLAN if m == "gpt"]
    # the next 3 (model, split) groups: gpt 16x1, 4x4 and 8x2, one child each
    assert r["step_skipped"] == [] and r["step_prewarm"]["children"] == 3
    assert r["step_prewarm"]["stopped"] == 0  # none had to be killed
    assert [row["variant"] for row in rows if row.get("grad_reference")] == [
        "gpt 16x1 default .backward()"]
    for row in rows:
        check_step_row(row)


class FakeClock:
    """bench's clock, for the budget: each run_variant takes 30 s of it."""
    now = 0.0

    @classmethod
    def time(cls):
        return cls.now

    perf_counter = time


def test_bench_step_budget_and_json_after_each_variant(monkeypatch):
    """Within a 100 s budget, variants run in STEP_PLAN's order while the next one's estimated end
    (the last time of its model and mode, else a guess) is inside it, and the rest are skipped and
    listed; the JSON is written after every variant, so a cut-off run keeps what finished; a
    variant that fails is recorded and the next one runs."""
    saved = []

    def fake_run(v, refs, after_first_pass):
        after_first_pass()
        FakeClock.now += 30
        if v[2] == "reduce-overhead" and v[1] == 4:
            raise RuntimeError("CUDA out of memory\nmore")
        return {"variant": bench.step_label(v), "ms_per_step": 1.0, "tokens_per_s": 1.0,
                "grad_ok": True, "first_pass_s": 1.0, "profile": {"error": "none"}}
    for k, v in dict(results={"matmul_peak_flops": 1.0}, t_start=0.0, step_budget=100, dry=True,
                     step_models="gpt,aed", step_prewarm=False, step_n_sequences=16,
                     device_type="cpu", time=FakeClock, run_variant=fake_run,
                     save_results=lambda: saved.append(len(bench.results["step"]))).items():
        monkeypatch.setattr(bench, k, v, raising=False)
    bench.bench_step()
    labels = [bench.step_label(v) for v in bench.STEP_PLAN]
    # 0 + 5 (the dry guess), 30 + 5, 60 + 30 (gpt reduce-overhead took 30), 90 + 5: then 120
    assert [row["variant"] for row in bench.results["step"]] == labels[:4]
    assert bench.results["step_skipped"] == labels[4:]
    assert saved == [1, 2, 3, 4]
    assert bench.results["step"][2]["error"] == "RuntimeError: CUDA out of memory"


def test_bench_step_gradient_check_marks_a_wrong_variant(monkeypatch):
    """The AED's dry step (a 1 + 1 block model): its step as it was is its gradient reference, a
    4-way split through autograd.grad is within float32 rounding of it (rows as
    test_bench_step_dry checks them); the same variant with gradients 10% off is marked wrong (over
    5e-2 relative)."""
    for k, v in dict(results={"matmul_peak_flops": 1.0}, dry=True, step_n_sequences=16,
                     step_steps=1, device="cpu", device_type="cpu").items():
        monkeypatch.setattr(bench, k, v, raising=False)
    refs = {}
    ref = bench.run_variant(("aed", 16, "default", "backward"), refs)
    assert ref["variant"] == "aed 16x1 default .backward()" and ref["grad_reference"]
    row = bench.run_variant(("aed", 4, "default", "grad"), refs)
    assert row["variant"] == "aed 4x4 default" and "grad_reference" not in row
    for r in (ref, row):
        check_step_row(r)
    accumulate = bench.Step.accumulate_grads

    def off(self):
        accumulate(self)
        torch._foreach_mul_(self.grads, 1.1)
    monkeypatch.setattr(bench.Step, "accumulate_grads", off)
    row = bench.run_variant(("aed", 4, "default", "grad"), refs)
    assert row["grad_rel_err"] == pytest.approx(0.1, rel=1e-3) and not row["grad_ok"]


@pytest.mark.parametrize("args,words", [
    (["--sections=step"], "--dry"),  # on a CPU
    (["--sections=step", "--dry", "--step_models=bert"], "step_models"),
    (["--sections=stepp"], "step"),
])
def test_bench_step_bad_option(args, words):
    p = run_here("bench.py", *args)
    assert p.returncode == 1 and words in p.stderr and "Traceback" not in p.stderr


def test_params_section_counts_every_config(tmp_path):
    """--sections=params: each config/ run's parameters, non-embedding parameters and FLOPs per
    token, as the model counts them (the author's counts for the key pair), without timing
    anything."""
    out = tmp_path / "bench.json"
    p = run_here("bench.py", "--sections=params", f"--out_json={out}")
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    rows = {row["config"]: row for row in r["params"]}
    configs = {f for f in os.listdir(os.path.join(HERE, "config")) if not f.endswith("_common.py")}
    assert set(rows) == configs and "matmul_peak_flops" not in r
    assert (rows["aed_mse_possub.py"]["params"] == 15_763_500
            and rows["baseline.py"]["params"] == 16_036_800)
    aed = Transformer(ModelConfig(arch="aed", n_layer=2, n_embed=96, n_head=4, cross_attn_n_head=8,
                                  context_size=128, embedding_loss_type="MSE",
                                  sub_pos_embed_to_decoder="YES_NO_LN", detach_type="ENCODER_OUT",
                                  embedding_ln_type="INIT", use_ln_on_encoder_out=True))
    row = rows["cpu_aed_mse_possub.py"]
    assert (row["params"], row["flops_per_token"]) == (aed.get_num_params(), aed.flops_per_token())
    assert row["non_embedding_params"] == aed.get_num_params() - 50257 * 96
    # the GPT widened to the AED preset's body: within 1% of it
    matched = rows["cpu_baseline_matched.py"]["non_embedding_params"]
    assert abs(matched / row["non_embedding_params"] - 1) < 0.01
