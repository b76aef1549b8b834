"""`crossbert zoo`: pretrained encoders and our checkpoints on one plot, offline, end to end; a zoo
interrupted mid-way resumes to the same tables; parameters counted from the loaded models."""

import re
from pathlib import Path

import pandas as pd
import pytest

from crossbert_eval.cli import main
from crossbert_eval.layer_spec import LayerSpec
from crossbert_eval.report.loading import load_baselines, read_result_rows
from crossbert_eval.encoders import FrozenEncoder
from crossbert_eval.zoo import ZooConfig, ZooModel, check_zoo_config, count_parameters, run_zoo
from crossbert_model.args import dump_yaml, load_config
from crossbert_model.errors import USER_ERROR_EXIT
from crossbert_model.readers import read_jsonl
from tiny_configs import tiny_train_config

REPO = Path(__file__).resolve().parent.parent
MINILM_ID = "sentence-transformers/all-MiniLM-L6-v2"
REV = "8b3219a92973c328a8e22fadcfa821b5dc75636a"  # the shared hub cache's (conftest.minilm_hub_cache)

# all-MiniLM-L6-v2 as AutoModel loads it (BertModel): the 22.7M of its model card, counted tensor by tensor.
MINILM_TOTAL = 22_713_216
MINILM_EMBEDDING = 30522 * 384 + 512 * 384 + 2 * 384  # word, position and token-type tables
MINILM_POOLER = 384 * 384 + 384


# -- fixtures --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub_cache(minilm_hub_cache):
    """The shared MiniLM hub cache (conftest), the Hugging Face cache for this module's zoo runs."""
    assert (minilm_hub_cache.repo_id, minilm_hub_cache.revision) == (MINILM_ID, REV)
    with pytest.MonkeyPatch.context() as mp:
        minilm_hub_cache.use(mp)
        yield minilm_hub_cache.root


@pytest.fixture(scope="module")
def our_runs(tmp_path_factory, corpus_args, corpus):
    """Two of our models, trained here: nano flat MLM and nano CrossBERT, 8 steps each (run folders)."""
    from crossbert_model.train import train

    out = tmp_path_factory.mktemp("zoo-runs")
    for name, objective in (("nano-mlm", "mlm"), ("nano-crossbert", "crossbert")):
        train(tiny_train_config(corpus_args, out, objective, name=name, steps=8, eval_every=8, log_every=10, num_threads=1))
    return {"mlm": out / "nano-mlm", "crossbert": out / "nano-crossbert"}


def zoo_config(tmp_path: Path, our_runs: dict, name: str, features: Path, **fields) -> ZooConfig:
    return ZooConfig(
        **fields,
        name=name,
        out_dir=str(tmp_path),
        features_dir=str(features),
        models=[
            ZooModel("minilm", name="MiniLM-L6", family="MiniLM"),
            ZooModel(MINILM_ID, name="MiniLM-L6 (hub id)", family="MiniLM by hub id"),
            ZooModel(str(our_runs["mlm"]), name="nano-mlm", family="ours: flat MLM"),
            ZooModel(str(our_runs["crossbert"]), name="nano-crossbert-cls", family="ours: CrossBERT", pooling="cls"),
        ],
        probe_tasks=["SST-2"],
        probes=["linear", "knn"],
        max_probe_train=300,
        max_probe_eval=200,  # of SST-2's 872 validation sentences: probes, geometry and baselines read the same 200
        geometry_tasks=["SST-2"],
        mteb_tasks=["BIOSSES"],
        mteb_layers=LayerSpec.LAST,  # 100 pairs: the smallest local mteb task
    )


@pytest.fixture(scope="module")
def straight_zoo(tmp_path_factory, our_runs, hub_cache):
    tmp = tmp_path_factory.mktemp("zoo")
    root = run_zoo(zoo_config(tmp, our_runs, "straight", tmp / "features"))
    return root, tmp


def _tables(root: Path) -> dict[str, pd.DataFrame]:
    scores = pd.read_csv(root / "tables" / "scores.csv")
    cols = ["size", "objective", "pooling", "task", "probe", "split", "layer", "metric", "value"]
    return {
        "scores": scores[cols].sort_values(cols[:-1]).reset_index(drop=True),
        **{name: pd.read_csv(root / "tables" / f"{name}.csv") for name in ("models", "summary", "last_vs_best", "geometry")},
    }


# -- end to end ------------------------------------------------------------------------------------


def test_an_offline_zoo_of_minilm_a_hub_id_and_our_checkpoints_reaches_the_report(straight_zoo, hub_cache, our_runs):
    root, _ = straight_zoo
    report = (root / "report.md").read_text()
    for section in ("## Models", "## Last layer, per model", "## Last layer vs best layer", "## Plots"):
        assert section in report
    for plot in ("collapse", "layerwise", "geometry_depth", "geometry_size"):
        assert (root / "plots" / f"{plot}.png").stat().st_size > 0 and f"plots/{plot}.png" in report

    models = pd.read_csv(root / "tables" / "models.csv").set_index("model")
    assert set(models.index) == {"MiniLM-L6", "MiniLM-L6 (hub id)", "nano-mlm", "nano-crossbert-cls"}
    assert models.loc["MiniLM-L6", "params_total"] == MINILM_TOTAL
    # pooling: the sentence-transformers config, the default, or the entry's own
    assert dict(models["pooling"]) == {
        "MiniLM-L6": "mean",
        "MiniLM-L6 (hub id)": "mean",
        "nano-mlm": "mean",
        "nano-crossbert-cls": "cls",
    }
    st_config = "sentence-transformers:1_Pooling/config.json"
    assert models.loc["MiniLM-L6", "pooling_source"] == models.loc["MiniLM-L6 (hub id)", "pooling_source"] == st_config
    assert models.loc["nano-mlm", "pooling_source"] == st_config and models.loc["nano-crossbert-cls", "pooling_source"] == "user"

    rows = pd.DataFrame(read_jsonl(root / "checkpoints.jsonl")).set_index("run")
    hub = rows.loc["MiniLM-L6 (hub id)"]
    assert hub["hub_id"] == MINILM_ID and hub["hub_revision"] == REV and Path(hub["resolved_folder"]).is_relative_to(hub_cache)
    assert hub["model_fingerprint"] == rows.loc["MiniLM-L6", "model_fingerprint"]  # the same weights...
    scores = pd.read_csv(root / "tables" / "scores.csv")
    assert scores["pooling"].notna().all() and scores["pooling_source"].notna().all()  # recorded in every row
    per_model = scores.pivot_table(index=["task", "probe", "layer", "metric"], columns="size", values="value")
    pd.testing.assert_series_equal(
        per_model["MiniLM-L6"], per_model["MiniLM-L6 (hub id)"], check_names=False
    )  # ... the same scores

    # every layer probed, mteb on the last one, geometry rows; our models' trained state recorded
    assert sorted(scores.loc[(scores["size"] == "MiniLM-L6") & (scores["probe"] == "linear"), "layer"].unique()) == list(range(7))
    assert set(scores["probe"]) == {"linear", "knn", "mteb"}
    assert set(pd.read_csv(root / "tables" / "geometry.csv")["model"]) == set(models.index)
    assert rows.loc["nano-mlm", "step"] == rows.loc["nano-mlm", "total_steps"] == 8 and rows.loc["nano-mlm", "corpus_tokens"] > 0
    # one seeded sample of SST-2's validation split (max_probe_eval): probes, geometry and baselines scored the same 200
    measured = pd.DataFrame(read_result_rows(root))
    sst2_rows = measured[measured["task"] == "SST-2"]
    assert set(sst2_rows["probe"]) == {"linear", "knn", "geometry"} and set(sst2_rows["n_eval"]) == {200}
    assert set(load_baselines(root).query("task == 'SST-2'")["n_eval"]) == {200}
    best = pd.read_csv(root / "tables" / "last_vs_best.csv")
    assert set(best["model"]) == set(models.index) and (best["last_minus_best"] <= 1e-9).all()
    sst2 = scores[
        (scores["size"] == "MiniLM-L6") & (scores["task"] == "SST-2") & (scores["probe"] == "linear") & (scores["layer"] == 6)
    ]
    assert sst2["value"].iloc[0] > 0.7  # MiniLM's last layer, 300 training sentences


def test_crossbert_report_rebuilds_a_zoo_folder(straight_zoo, capsys, monkeypatch):
    from crossbert_eval.report import zoo_report

    monkeypatch.setattr(zoo_report, "ZOO_PLOTS", {})  # the tables are the subject; the straight zoo's report drew the plots
    root, _ = straight_zoo
    before = _tables(root)
    (root / "report.md").unlink()
    main(["report", str(root)])
    assert "# Zoo report: straight" in (root / "report.md").read_text()
    for name, df in _tables(root).items():
        pd.testing.assert_frame_equal(df, before[name], obj=name)


def test_a_zoo_interrupted_mid_way_resumes_to_the_same_tables(straight_zoo, our_runs, monkeypatch):
    """Interrupted during the third model's probes (after MiniLM and the hub entry), then run again. The reports
    written on the way draw no plots: this test checks their tables (the straight zoo's report checks the plots)."""
    import crossbert_eval.zoo
    from crossbert_eval.probe_runner import ProbeRunner
    from crossbert_eval.report.zoo_report import build_zoo_report

    monkeypatch.setattr(crossbert_eval.zoo, "build_zoo_report", lambda root: build_zoo_report(root, plots=()))

    straight, tmp = straight_zoo
    # the same feature cache: nothing re-encoded; a report after every model, so the interrupted zoo leaves one
    cfg = zoo_config(tmp, our_runs, "interrupted", tmp / "features", report_every_s=0.0)
    fit, calls = ProbeRunner._fit, []

    def interrupted(self, *args, **kwargs):
        calls.append(self.encoder.name)
        if len(calls) == 14 + 3:  # MiniLM: 7 layers x 2 probes; the hub entry: none (its units are MiniLM's); then nano-mlm
            raise KeyboardInterrupt
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(ProbeRunner, "_fit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_zoo(cfg)
    assert calls[-1].startswith("nano-mlm")
    root = Path(cfg.out_dir) / cfg.name
    partial = pd.read_csv(root / "tables" / "scores.csv")
    assert set(partial["size"]) == {"MiniLM-L6", "MiniLM-L6 (hub id)"}  # the report after the second model
    monkeypatch.setattr(ProbeRunner, "_fit", fit)
    run_zoo(zoo_config(tmp, our_runs, "interrupted", tmp / "features"))
    resumed, expected = _tables(root), _tables(straight)
    for name in expected:
        pd.testing.assert_frame_equal(resumed[name], expected[name], obj=name)


@pytest.mark.parametrize("every_s, reports", [(0.0, 4), (3600.0, 1)])
def test_the_zoo_report_is_rebuilt_as_often_as_asked_and_always_at_the_end(tmp_path, monkeypatch, every_s, reports):
    import crossbert_eval.zoo

    cfg = zoo_config(tmp_path, {"mlm": "minilm", "crossbert": "minilm"}, "paced", tmp_path / "f", report_every_s=every_s)
    zoo, calls = crossbert_eval.zoo.Zoo(cfg), []
    monkeypatch.setattr(crossbert_eval.zoo, "preflight", lambda cfg: None)
    monkeypatch.setattr(crossbert_eval.zoo, "evaluate_baselines", lambda *args: None)
    monkeypatch.setattr(zoo, "evaluate_model", lambda i, entry: calls.append("model"))
    monkeypatch.setattr(zoo, "report", lambda: calls.append("report"))
    zoo.run()
    assert calls.count("model") == 4 and calls.count("report") == reports and calls[-1] == "report"


# -- parameters ------------------------------------------------------------------------------------


def test_minilm_parameters_counted_from_the_loaded_model():
    counts = count_parameters(FrozenEncoder.load("minilm").model)
    assert counts == {
        "params_total": MINILM_TOTAL,
        "params_embedding": MINILM_EMBEDDING,
        "params_pooler": MINILM_POOLER,
        "params_non_embedding": MINILM_TOTAL - MINILM_EMBEDDING - MINILM_POOLER,
    }
    assert round(counts["params_total"] / 1e6, 1) == 22.7  # the model card's figure


@pytest.mark.parametrize("objective", ["mlm", "crossbert"])
def test_our_presets_counted_from_the_model_match_the_config_accounting(objective):
    import torch

    import crossbert_model as cm
    from crossbert_model.presets import PRESETS
    from crossbert_model.objectives import config_from_preset, parameter_counts

    for preset in PRESETS:
        config = config_from_preset(preset, objective=objective, vocab_size=8192)
        with torch.device("meta"):  # shapes only: base and large cost no memory
            model = cm.CrossBertModel(config)
        counts, expected = count_parameters(model), parameter_counts(config)
        assert counts["params_non_embedding"] == expected["encoder_non_embedding"], preset
        assert counts["params_total"] == expected["encoder"] and counts["params_pooler"] == 0, preset


def test_our_trained_checkpoints_in_the_zoo_carry_their_config_counts(straight_zoo, our_runs):
    from crossbert_model.objectives import parameter_counts

    root, _ = straight_zoo
    rows = {r["run"]: r for r in read_jsonl(root / "checkpoints.jsonl")}
    for name, run in (("nano-mlm", our_runs["mlm"]), ("nano-crossbert-cls", our_runs["crossbert"])):
        expected = parameter_counts(FrozenEncoder.load(str(run)).model.config)
        assert rows[name]["params_non_embedding"] == expected["encoder_non_embedding"]
        assert rows[name]["params_total"] == expected["encoder"]


# -- configs and mistakes --------------------------------------------------------------------------


def test_shipped_zoo_configs_resolve():
    minis = load_config(ZooConfig, REPO / "configs/zoo/bert_miniatures.yaml")
    check_zoo_config(minis)
    ids = [m.model for m in minis.models]
    turc = [i for i in ids if i.startswith("google/bert_uncased_")]
    assert len(turc) == 24 and len(ids) == 26
    for model_id in turc:
        layers, hidden, heads = map(int, re.fullmatch(r"google/bert_uncased_L-(\d+)_H-(\d+)_A-(\d+)", model_id).groups())
        assert layers in (2, 4, 6, 8, 10, 12) and hidden in (128, 256, 512, 768) and heads == hidden // 64
    assert {"google-bert/bert-base-uncased", "google-bert/bert-large-uncased"} <= set(ids)
    families = load_config(ZooConfig, REPO / "configs/zoo/mlm_families.yaml")
    check_zoo_config(families)
    assert sorted({m.family for m in families.models}) == ["BERT", "ModernBERT", "RoBERTa"] and len(families.models) == 6
    check_zoo_config(load_config(ZooConfig, REPO / "configs/zoo/offline.yaml"))


MISTAKES = {
    "missing model folder": (
        ["models=[{model: /nonexistent/model, name: gone}]"],
        ["models[0] (gone)", "/nonexistent/model", "no such folder"],
    ),
    "hub id not in the cache": (
        ["models=[{model: google/bert_uncased_L-2_H-128_A-2}]"],
        ["google/bert_uncased_L-2_H-128_A-2", "not in the local Hugging Face cache", "CROSSBERT_ONLINE=1"],
    ),
    "unknown key": (["modles=[]"], ["modles"]),
    "unknown entry key": (["models=[{model: minilm, poolng: cls}]"], ["poolng", "valid keys"]),
    "bad pooling": (
        ["models=[{model: minilm, name: a}, {model: minilm, name: second, pooling: avg}]"],
        ["models[1] (second).pooling", "mean, cls, max", "'avg'"],
    ),
    "bad value in an entry named with an apostrophe, set by an override": (
        ["""models=[{model: minilm, name: "Bob's", pooling: avg}]"""],
        ["command-line override", "models[0] (Bob's).pooling", "'avg'"],
    ),
    "bad value in an entry whose name holds ': ' and dots, set by an override": (
        ["""models=[{model: minilm, name: "v1.2: base", pooling: avg}]"""],
        ["command-line override", "models[0] (v1.2: base).pooling", "'avg'"],
    ),
    "duplicate names": (
        ["models=[{model: minilm, name: a}, {model: minilm, name: a}]"],
        ["zoo field 'models'", "the display name 'a' is given twice"],
    ),
    "no models": ([], ["'models'", "none"]),
    "unknown probe task": (["models=[{model: minilm}]", "probe_tasks=[SST-3]"], ["SST-3"]),
}


@pytest.mark.parametrize("case", MISTAKES, ids=list(MISTAKES))
def test_a_mistake_in_a_zoo_is_one_line_exit_2_and_nothing_written(case, tmp_path, capsys, monkeypatch, no_network):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    overrides, needles = MISTAKES[case]
    config = tmp_path / "zoo.yaml"
    config.write_text(dump_yaml({"name": "mistake", "out_dir": str(tmp_path / "out"), "mteb_tasks": []}))
    with pytest.raises(SystemExit) as exit_:
        main(["zoo", str(config), *overrides])
    assert exit_.value.code == USER_ERROR_EXIT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("crossbert zoo: error:"), err
    for needle in needles:
        assert needle in err, (needle, err)
    assert not (tmp_path / "out").exists()


def test_a_zoo_entry_that_needs_its_own_code_names_the_entrys_field_that_allows_it(tmp_path, capsys, no_network):
    # catches: a loader's refusal said with the command line's option (--trust-remote-code), which a zoo does not have,
    # instead of the entry's field; or the folder's code run without it
    from own_code import folder_with_own_code

    model = folder_with_own_code(tmp_path / "in", tmp_path / "code-ran")
    config = tmp_path / "zoo.yaml"
    config.write_text(dump_yaml({"name": "own", "out_dir": str(tmp_path / "out"), "mteb_tasks": [], "geometry_tasks": []}))
    with pytest.raises(SystemExit) as exit_:
        main(["zoo", str(config), f"models=[{{model: {model}, name: own, pooling: mean}}]", "probe_tasks=[MRPC]"])
    assert exit_.value.code == USER_ERROR_EXIT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "zoo models[0] (own): " in err, err
    assert "unless you set models[0].trust_remote_code, for a folder you trust" in err, err
    assert not (tmp_path / "code-ran").exists()
