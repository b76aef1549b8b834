"""bench/gpu_check.py, the one prepared GPU script, runs on the CPU at tiny shapes (the lent GPU
machine gets exactly this code): every contender measured, every objective's loss falling."""

import json
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_gpu_check_runs_on_cpu_at_tiny_shapes(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_check

    result = gpu_check.main(["--smoke", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["throughput"] == json.loads(json.dumps(result["throughput"]))
    measured = {r["contender"]: r for r in saved["throughput"] if "skipped" not in r}
    assert set(measured) == set(gpu_check.CONTENDERS)
    assert all(r["sequence_tokens_per_s"] > 0 and r["mfu"] > 0 for r in measured.values())
    assert measured["crossbert_r50_cms"]["views"] == 2 and measured["crossbert_r75_cms"]["views"] == 4
    assert "flash" in measured["flat_mlm30"]["sdpa"]  # packed batches: SDPA's unmasked flash kernel
    assert "x_vs_hf" in measured["flat_mlm30"] and "x_vs_flat_mlm" in measured["crossbert_r50_cms"]
    runs = saved["short_runs"]
    assert [r["contender"] for r in runs] == ["flat_mlm30", "crossbert_r50_cms", "crossbert_r50_nocms"]
    assert all(r["finite"] and r["loss_falls"] for r in runs), runs
    assert saved["feature_extraction"]["sentences_per_s"] > 0
    assert (tmp_path / "gpu_check.md").read_text().startswith("# GPU check on cpu")


def test_step_counts_default_per_mode_but_an_explicit_value_is_kept(monkeypatch):
    import pytest

    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_check

    smoke, full = gpu_check.parse_args(["--smoke"]), gpu_check.parse_args([])
    assert (smoke.warmup, smoke.steps, full.warmup, full.steps) == (1, 2, 5, 20)
    assert gpu_check.parse_args(["--smoke", "--warmup", "0", "--steps", "3"]).warmup == 0  # 0 is a value, not "unset"
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--steps", "0"])
