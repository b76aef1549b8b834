"""Every config shipped under configs/ runs as shipped: each loads and passes the checks its command makes before any
work (the typed loader, then the train / sweep / zoo validators), offline, with nothing trained, probed or written.
A typo'd key, a bad value, an unknown task, probe or preset in a shipped file fails here, not an hour into a run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from crossbert_eval.sweep_config import SweepConfig
from crossbert_eval.sweep_plan import check_machine, check_tasks, plan_runs
from crossbert_eval.zoo import ZooConfig, ZooError, check_zoo_config, preflight
from crossbert_model.args import load_config
from crossbert_model.train_config import TrainConfig, validate_config

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def shipped(kind: str) -> list[Path]:
    return sorted((CONFIGS / kind).glob("*.yaml"))


def test_configs_holds_train_sweep_and_zoo_configs_only():
    # a config of another kind (or in another folder) would be checked by none of the tests below
    assert {p.relative_to(CONFIGS).parent.as_posix() for p in CONFIGS.rglob("*.y*ml")} == {"train", "sweep", "zoo"}
    assert all(shipped(kind) for kind in ("train", "sweep", "zoo"))


@pytest.mark.parametrize("config", shipped("train"), ids=lambda p: p.stem)
def test_train_config_is_valid_as_shipped(config):
    validate_config(load_config(TrainConfig, config))


@pytest.mark.parametrize("config", shipped("sweep"), ids=lambda p: p.stem)
def test_sweep_config_is_valid_as_shipped(config):
    cfg = load_config(SweepConfig, config)
    assert plan_runs(cfg)  # grid, budgets, probe settings and every run's resolved training config
    check_tasks(cfg)  # probe, geometry and mteb tasks, each found offline
    # the machine fields' values; a sweep that asks for a CUDA GPU is checked as if this machine had one
    check_machine(dataclasses.replace(cfg, device=None) if cfg.device == "cuda" else cfg)


@pytest.mark.parametrize("config", shipped("zoo"), ids=lambda p: p.stem)
def test_zoo_config_is_valid_as_shipped(config, monkeypatch):
    cfg = load_config(ZooConfig, config)
    check_zoo_config(cfg)  # entries, poolings, probes, layers and task names
    if any(entry.made_by for entry in cfg.models):
        return  # a zoo of models made first: its preflight is the next test's
    # a zoo of hub ids is run online (CROSSBERT_ONLINE=1): its preflight then checks each id's form and the mteb tasks,
    # reading no network
    monkeypatch.setenv("CROSSBERT_ONLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    preflight(cfg)


def test_the_offline_zoo_runs_on_a_fresh_clone(tmp_path, monkeypatch):
    """configs/zoo/offline.yaml needs only what `make setup` installs: no hub cache, no trained checkpoint."""
    monkeypatch.chdir(tmp_path)  # no runs/ folder here
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_config(ZooConfig, CONFIGS / "zoo/offline.yaml")
    preflight(cfg)
    assert {entry.pooling for entry in cfg.models} == {None, "cls"}  # two points of one model


def test_a_zoo_of_models_made_first_names_each_missing_one_with_what_makes_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for config in shipped("zoo"):
        cfg = load_config(ZooConfig, config)
        made = [(i, entry) for i, entry in enumerate(cfg.models) if entry.made_by]
        if not made:
            continue
        with pytest.raises(ZooError) as raised:
            preflight(cfg)
        message = str(raised.value)
        assert f"{len(made)} of {len(cfg.models)} models cannot run" in message
        for i, entry in made:
            assert f"models[{i}] ({entry.name})" in message and f"made by: {entry.made_by}" in message
