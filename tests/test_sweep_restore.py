"""A sweep folder restored from a committed reference of it (`crossbert sweep CONFIG --restore results/<study>`):
only the runs the reference did not finish are run again, and only runs trained and probed the same way count."""

import lzma
from pathlib import Path

import pytest

from crossbert_model.args import ConfigError, dump_yaml, load_config
from crossbert_model.readers import read_jsonl
from crossbert_eval.folder_layout import SweepDir
from crossbert_eval.sweep import Sweep
from crossbert_eval.sweep_config import SweepConfig
from crossbert_eval.sweep_plan import plan_runs
from crossbert_eval.sweep_restore import restore_sweep

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs/sweep/cpu_small.yaml"  # the main job's plan: 12 runs


def _config(out_dir: Path, *overrides: str) -> SweepConfig:
    return load_config(SweepConfig, CONFIG, [f"out_dir={out_dir}", *overrides])


def _lines(rows: list[dict]) -> str:
    return "".join(f'{{"run": "{r["run"]}", "step": {r["step"]}, "model_fingerprint": "{r["fp"]}"}}\n' for r in rows)


def _reference(folder: Path, finished: int, *overrides: str) -> tuple[Path, list[str]]:
    """A committed reference as `make reference` leaves it (store xz-compressed, no checkpoints) in which the first
    `finished` runs of the plan are done and the next one has only its first checkpoint probed."""
    cfg = _config(folder.parent / "elsewhere", *overrides)
    runs = plan_runs(cfg)
    done, partial = runs[:finished], runs[finished]
    ref = SweepDir(folder)
    ref.results.mkdir(parents=True)
    ref.baselines.mkdir()
    ref.config.write_text(dump_yaml(cfg))
    probed = [{"run": r.key, "step": r.train.steps, "fp": f"fp-{r.key}"} for r in done]
    probed.append({"run": partial.key, "step": partial.train.steps // 2, "fp": f"fp-{partial.key}-early"})
    ref.models.write_text(_lines(probed))
    with lzma.open(ref.results / "results.jsonl.xz", "wt") as f:
        f.write("".join(f'{{"model_fingerprint": "{p["fp"]}", "task": "SST-2", "value": 0.5}}\n' for p in probed))
    (ref.baselines / "results.jsonl").write_text('{"task": "SST-2", "baseline": "majority", "value": 0.5}\n')
    ref.reliance.write_text("".join(f'{{"run": "{r.key}", "step": {r.train.steps}}}\n' for r in done))
    ref.timings.write_text("".join(f'{{"stage": "train", "run": "{r.key}", "seconds": 1.0}}\n' for r in [*done, partial]))
    return folder, [r.key for r in done]


def test_a_restored_sweep_runs_only_what_its_reference_did_not_finish(tmp_path, monkeypatch):
    reference, finished = _reference(tmp_path / "reference", 5)
    cfg = _config(tmp_path / "sweeps")
    assert restore_sweep(cfg, reference) == finished
    sweep = Sweep(cfg)
    assert [r.key for r in sweep.pending()] == [r.key for r in sweep.runs if r.key not in finished]
    folder = SweepDir(cfg.root)
    scores = read_jsonl(folder.results / "results.jsonl")
    assert [r["model_fingerprint"] for r in scores] == [f"fp-{key}" for key in finished]  # not the unfinished run's
    assert [r["run"] for r in read_jsonl(folder.models)] == finished
    assert [r["run"] for r in read_jsonl(folder.reliance)] == finished
    assert [r["run"] for r in read_jsonl(folder.timings)] == finished
    assert read_jsonl(folder.baselines / "results.jsonl")[0]["baseline"] == "majority"  # baselines are not computed again

    calls = []
    monkeypatch.setattr(sweep, "train_run", lambda run: calls.append(run.key))
    monkeypatch.setattr(sweep, "evaluate_run", lambda run: None)
    monkeypatch.setattr(sweep, "record_reliance", lambda run: None)
    monkeypatch.setattr(sweep, "report", lambda: None)
    monkeypatch.setattr(sweep, "compute_baselines", lambda: None)
    sweep.run()
    assert calls == [r.key for r in sweep.runs if r.key not in finished]


def test_the_same_restore_again_goes_on_with_the_restored_folder(tmp_path):
    reference, finished = _reference(tmp_path / "reference", 3)
    cfg = _config(tmp_path / "sweeps")
    restore_sweep(cfg, reference)
    before = {p: p.read_bytes() for p in SweepDir(cfg.root).path.rglob("*") if p.is_file()}
    assert restore_sweep(cfg, str(reference)) == finished  # a worker started second, or the command run again
    assert {p: p.read_bytes() for p in SweepDir(cfg.root).path.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(
    "overrides, restored",
    [
        (["train.num_threads=1", "worker_poll_s=5", "report_every_s=60"], 4),  # where and how fast: the same runs
        (["seeds=[0,1,2,3]"], 4),  # a seed more: the reference's runs stay done, the new seed's runs are added
        (["train.optim.lr=1e-4"], 0),  # trained otherwise
        (["budget_tokens=800000"], 0),  # trained for another number of steps
        (["probe_tasks=[SST-2,STS-B,MRPC]"], 0),  # probed otherwise
    ],
)
def test_only_runs_trained_and_probed_as_this_sweep_asks_are_restored(tmp_path, overrides, restored):
    reference, finished = _reference(tmp_path / "reference", 4)
    cfg = _config(tmp_path / "sweeps", *overrides)
    assert restore_sweep(cfg, reference) == finished[:restored]
    assert len(Sweep(cfg).pending()) == len(plan_runs(cfg)) - restored


def test_a_folder_with_work_of_its_own_is_never_overwritten(tmp_path):
    reference, _ = _reference(tmp_path / "reference", 4)
    cfg = _config(tmp_path / "sweeps")
    checkpoint = SweepDir(cfg.root).run("mlm-nano-s0").path / "config.yaml"  # a run trained here, not yet probed
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_text("seed: 0\n")
    with pytest.raises(ConfigError, match="already holds runs of its own; restore only into a new sweep folder"):
        restore_sweep(cfg, reference)
    assert [p.name for p in SweepDir(cfg.root).path.iterdir()] == ["runs"]


def test_a_folder_that_is_no_reference_is_named(tmp_path):
    (tmp_path / "notes").mkdir()
    with pytest.raises(ConfigError, match=r"reference: .*notes is not a reference of a sweep \(.*notes/sweep.yaml is missing"):
        restore_sweep(_config(tmp_path / "sweeps"), tmp_path / "notes")
    assert not (tmp_path / "sweeps").exists()


def test_a_damaged_reference_is_refused_before_anything_is_written(tmp_path):
    reference, _ = _reference(tmp_path / "reference", 2)
    (reference / "sweep.yaml").write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="sweep.yaml:2: not valid YAML"):
        restore_sweep(_config(tmp_path / "sweeps"), reference)
    assert not (tmp_path / "sweeps").exists()
