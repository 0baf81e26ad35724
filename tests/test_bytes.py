"""A byte-level run as a user makes it: prepare.py --tokenizer=bytes, train.py with the byte config
(made tiny), sample.py, and the floors of the same data; each script run in this process
(conftest.run_here: as its command line runs it, without a torch import each)."""
import json

from conftest import run_here


def test_prepare_train_sample_floors_on_bytes(tmp_path):
    text = "<|endoftext|>".join(f"Le café numéro {i} est ouvert, naïve ∑ {i * i}." * 3
                                for i in range(400))
    (tmp_path / "cafe.txt").write_text(text, encoding="utf-8")
    data = tmp_path / "data"
    p = run_here("prepare.py", f"--input={tmp_path / 'cafe.txt'}", "--tokenizer=bytes",
                 f"--data_dir={data}")
    assert p.returncode == 0, p.stderr
    assert "config/bytes_aed_mse_possub.py" in p.stdout and "--dataset=cafe_bytes" in p.stdout
    meta = json.loads((data / "cafe_bytes" / "meta.json").read_text())
    assert (meta["tokenizer"], meta["vocab_size"]) == ("bytes", 256)
    out = tmp_path / "out"
    p = run_here("train.py", "config/bytes_aed_mse_possub.py", f"--data_dir={data}",
                 "--dataset=cafe_bytes", f"--out_dir={out}", "--train_tokens=0", "--n_embed=16",
                 "--n_layer=1", "--n_head=2", "--cross_attn_n_head=4", "--context_size=32",
                 "--batch_size=4", "--train_steps=150", "--warmup_iters=5", "--est_interval=50",
                 "--est_steps=2")
    assert p.returncode == 0, p.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["whole_val_best"] < 3.5  # ln 256 = 5.5
    p = run_here("sample.py", f"--out_dir={out}", "--start=Le café", "--num_samples=2",
                 "--max_new_tokens=40")
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("---------------") == 2 and p.stdout.startswith("Le café")
    p = run_here("experiments/floors.py", f"--data_dir={data}", "--dataset=cafe_bytes",
                 "--context_size=32", "--max_order=3")
    assert p.returncode == 0, p.stderr
    assert "from all" in p.stdout and "3-gram" in p.stdout
