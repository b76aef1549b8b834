"""The sweep report: aggregation over seeds, GLUE / MTEB averages, plots and pages from the sweep's files."""

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from crossbert_eval.folder_layout import SweepDir
from crossbert_eval.report.loading import ReportError
from crossbert_eval.report.sweep_report import build_sweep_report
from crossbert_model.errors import CrossbertError

SIZES = {"nano": (2, 100_000), "tiny": (4, 400_000)}  # layers, non-embedding params
TABLES_ONLY = ()  # no plot drawn: for tests of the tables and the page's text (rendering a plot costs seconds)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _score(objective: str, size: str, seed: int, task: str, layer: int, step: int) -> float:
    """A deterministic, distinct value per cell so every aggregate can be recomputed by hand."""
    base = {"mlm": 0.6, "crossbert": 0.5}[objective] + 0.1 * list(SIZES).index(size)
    return round(base + 0.01 * seed + 0.001 * layer + 0.0001 * step + 0.02 * ("STS" in task), 6)


@pytest.fixture
def sweep_root(tmp_path):
    return write_sweep_rows(tmp_path)


@pytest.fixture(scope="module")
def fully_reported(tmp_path_factory) -> tuple[Path, str]:
    """A sweep store and its report with every plot, built once for the tests that only read them (a plot costs
    seconds): the folder and report.md."""
    root = write_sweep_rows(tmp_path_factory.mktemp("fully-reported"))
    return root, build_sweep_report(root).read_text()


def write_sweep_rows(tmp_path: Path) -> Path:
    """A sweep folder of score rows and checkpoint rows (2 objectives x 2 sizes x 2 seeds x 2 checkpoints)."""
    checkpoints, results = [], []
    tasks = [
        ("SST-2", "glue", "linear"),
        ("STS-B", "glue", "linear"),
        ("STSBenchmark", "mteb:STS", "mteb"),
        ("Banking77Classification", "mteb:Classification", "mteb"),
    ]
    for objective in ("mlm", "crossbert"):
        for size, (layers, params) in SIZES.items():
            for seed in (0, 1):
                for step in (50, 100):
                    fp = f"{objective}-{size}-{seed}-{step}"
                    checkpoints.append(
                        {
                            "run": f"{objective}-{size}-s{seed}",
                            "objective": objective,
                            "size": size,
                            "seed": seed,
                            "step": step,
                            "total_steps": 100,
                            "checkpoint": fp,
                            "model_fingerprint": fp,
                            "params_non_embedding": params,
                            "params_encoder": params,
                            "hidden_size": 32,
                            "layers": layers,
                            "corpus_tokens": step * 1000,
                            "train_flops": step * 1000 * params * 6.0,
                            "val_loss": 7.0 - 0.5 * layers - 0.1 * seed,
                        }
                    )
                    for task, family, probe in tasks:
                        for layer in range(layers + 1):
                            results.append(
                                {
                                    "model_fingerprint": fp,
                                    "task": task,
                                    "family": family,
                                    "split": "validation" if probe != "mteb" else "test",
                                    "probe": probe,
                                    "layer": layer,
                                    "relative_depth": layer / layers,
                                    "pooling": "mean",
                                    "metric": "main",
                                    "value": _score(objective, size, seed, task, layer, step),
                                    "is_main": True,
                                }
                            )
    _write_jsonl(tmp_path / "checkpoints.jsonl", checkpoints)
    _write_jsonl(tmp_path / "results" / "results.jsonl", results)
    return tmp_path


def test_report_averages_over_seeds_with_their_spread(sweep_root):
    build_sweep_report(sweep_root, plots=TABLES_ONLY)
    sizes = pd.read_csv(sweep_root / "tables" / "summary_by_size.csv")
    row = sizes[(sizes["objective"] == "mlm") & (sizes["size"] == "tiny")].iloc[0]
    assert row["seeds"] == 2
    per_seed = [100 * _score("mlm", "tiny", s, "SST-2", 4, 100) for s in (0, 1)]
    assert row["SST-2:linear"] == pytest.approx(np.mean(per_seed))
    assert row["SST-2:linear_std"] == pytest.approx(np.std(per_seed, ddof=1))
    glue = [np.mean([100 * _score("mlm", "tiny", s, t, 4, 100) for t in ("SST-2", "STS-B")]) for s in (0, 1)]
    assert row["glue_linear"] == pytest.approx(np.mean(glue))
    assert row["mteb_sts"] == pytest.approx(np.mean([100 * _score("mlm", "tiny", s, "STSBenchmark", 4, 100) for s in (0, 1)]))
    assert row["val_loss"] == pytest.approx(7.0 - 2.0 - 0.05)


def test_report_writes_every_plot_and_both_pages(fully_reported):
    sweep_root, md = fully_reported
    for name in ("collapse", "loss_vs_probe", "layerwise", "training", "training_flops", "losses", "losses_flops"):
        for ext in ("png", "svg"):
            assert (sweep_root / "plots" / f"{name}.{ext}").stat().st_size > 1000, name
    assert "plots/collapse.png" in md and "| mlm | tiny |" in md
    assert "<table>" in (sweep_root / "report.html").read_text()
    summary = pd.read_parquet(sweep_root / "tables" / "summary.parquet")
    assert len(summary) == 2 * 2 * 2 * 2  # objectives x sizes x seeds x checkpoints


def test_a_report_asked_for_some_plots_draws_and_shows_only_those_and_its_tables_are_the_same(sweep_root, tmp_path_factory):
    none = tmp_path_factory.mktemp("no-plots")
    shutil.copytree(sweep_root, none, dirs_exist_ok=True)
    build_sweep_report(none, plots=TABLES_ONLY)
    assert not (none / "plots").exists()
    md = build_sweep_report(sweep_root, plots=["collapse"]).read_text()
    assert sorted(p.name for p in (sweep_root / "plots").iterdir()) == ["collapse.png", "collapse.svg"]
    assert "plots/collapse.png" in md and "plots/layerwise.png" not in md
    for table in sorted((none / "tables").glob("*.parquet")):
        pd.testing.assert_frame_equal(pd.read_parquet(sweep_root / "tables" / table.name), pd.read_parquet(table), obj=table.name)
    with pytest.raises(ValueError, match="unknown plot"):
        build_sweep_report(sweep_root, plots=["colapse"])


def test_report_of_a_sweep_without_scores_writes_nothing(tmp_path):
    (tmp_path / "sweep.yaml").write_text("name: empty\n")
    assert build_sweep_report(tmp_path) is None
    assert not (tmp_path / "report.md").exists()


@pytest.mark.parametrize("make", [False, True])
def test_report_of_a_folder_that_is_no_sweep_is_a_user_error(tmp_path, make):
    folder = tmp_path / "nothing"
    if make:
        folder.mkdir()
    with pytest.raises(ReportError, match=r"nothing: not a sweep folder \(no results/results.jsonl or sweep.yaml\)") as e:
        build_sweep_report(folder)
    assert isinstance(e.value, CrossbertError)
    assert not folder.exists() or not list(folder.iterdir())  # nothing written


def _rewrite_results(root: Path, edit) -> None:
    path = root / "results" / "results.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    _write_jsonl(path, edit(rows))


def test_report_flags_units_written_twice(sweep_root):
    def duplicate_two(rows):
        for i, r in enumerate(rows):
            r["unit"] = f"u{i:05d}"
        return rows + [dict(rows[0]), dict(rows[1]), dict(rows[1])]

    _rewrite_results(sweep_root, duplicate_two)
    md = build_sweep_report(sweep_root, plots=TABLES_ONLY).read_text()
    warning = next(line for line in md.splitlines() if "WARNING" in line)
    assert "2 unit(s) are in results/results.jsonl more than once (3 extra copies" in warning
    assert "u00000 (2x)" in warning and "u00001 (3x)" in warning


def test_clean_store_has_no_duplicate_warning(sweep_root):
    assert "WARNING" not in build_sweep_report(sweep_root, plots=TABLES_ONLY).read_text()


def test_old_rows_with_versions_and_string_layers_still_report(sweep_root):
    """Rows written before provenance used `packages`, and with the layer as a string, read as today's."""

    def old_style(rows):
        return [{**r, "layer": str(r["layer"]), "versions": {"torch": "2.0"}} for r in rows]

    _rewrite_results(sweep_root, old_style)
    build_sweep_report(sweep_root, plots=TABLES_ONLY)
    scores = pd.read_csv(sweep_root / "tables" / "scores.csv")
    assert scores["layer"].dtype.kind == "i" and scores["layer"].max() == 4
    sizes = pd.read_csv(sweep_root / "tables" / "summary_by_size.csv")
    row = sizes[(sizes["objective"] == "mlm") & (sizes["size"] == "tiny")].iloc[0]
    assert row["SST-2:linear"] == pytest.approx(np.mean([100 * _score("mlm", "tiny", s, "SST-2", 4, 100) for s in (0, 1)]))


# -- uncertainty: error bars over seeds, and which differences are larger than the noise --------------

from crossbert_eval.report import loading, markdown, noise, plots, tables  # noqa: E402


def test_error_bars_are_min_max_with_two_seeds_and_named_in_the_captions(fully_reported):
    sweep_root, md = fully_reported
    scores = loading.load_scores(sweep_root)
    final = scores[scores["is_main"] & scores["is_final"] & (scores["task"] == "SST-2")]
    bands = noise.seed_bands(final, ["objective", "size", "relative_depth"])  # what the layer-wise plot draws
    row = bands[(bands["objective"] == "mlm") & (bands["size"] == "tiny") & (bands["relative_depth"] == 1.0)].iloc[0]
    per_seed = [100 * _score("mlm", "tiny", s, "SST-2", 4, 100) for s in (0, 1)]
    assert row["band"] == "min-max" and row["seeds"] == 2 and row["mean"] == pytest.approx(np.mean(per_seed))
    assert row["err_low"] == pytest.approx(np.mean(per_seed) - min(per_seed)) and row["err_high"] == pytest.approx(
        max(per_seed) - np.mean(per_seed)
    )
    for name in ("collapse", "layerwise", "training"):
        assert f"*{name}: error bars: min–max over 2 seeds*" in md
    assert (
        "*loss_vs_probe: one point per run (8 runs; final checkpoint, last layer); no error bars" in md
    )  # a run each: no spread
    sizes = pd.read_csv(sweep_root / "tables" / "summary_by_size.csv")  # tables: mean, std and min / max over seeds, seeds
    assert {"SST-2:linear", "SST-2:linear_std", "SST-2:linear_min", "SST-2:linear_max", "seeds"} <= set(sizes.columns)
    bars = noise.size_bands(sizes[sizes["objective"] == "mlm"], "SST-2:linear")  # what the collapse plot draws
    assert (bars["band"] == "min-max").all() and (bars["err_low"] > 0).all()
    mlm_tiny = sizes[(sizes["objective"] == "mlm") & (sizes["size"] == "tiny")].iloc[0]
    assert f"{mlm_tiny['SST-2:linear']:.2f} ± {mlm_tiny['SST-2:linear_std']:.2f}" in md.split("## Last layer vs best layer")[0]


def test_three_seeds_give_std_bars_and_one_seed_the_bootstrap_interval():
    rows = pd.DataFrame(
        {
            "g": ["a"] * 3 + ["b"],
            "seed": [0, 1, 2, 0],
            "score": [1.0, 2.0, 3.0, 5.0],
            "score_ci_low": [np.nan] * 3 + [4.0],
            "score_ci_high": [np.nan] * 3 + [7.0],
        }
    )
    bands = noise.seed_bands(rows, ["g"]).set_index("g")
    assert bands.loc["a", "band"] == "std" and bands.loc["a", "err_low"] == pytest.approx(1.0) == bands.loc["a", "err_high"]
    assert bands.loc["b", "band"] == "bootstrap" and (bands.loc["b", "err_low"], bands.loc["b", "err_high"]) == (1.0, 2.0)
    assert noise.band_caption(bands["band"]) == "error bars: mean ± std over seeds; bootstrap 95% interval (1 seed)"


@pytest.mark.parametrize(
    ("bands", "caption"),
    [
        (["bootstrap", "none"], "error bars: bootstrap 95% interval (1 seed); none on points of 1 seed without an interval"),
        (["none"], "no error bars (1 seed, no interval)"),
        (["std", "none"], "error bars: mean ± std over seeds; none on points of 1 seed without an interval"),
        ([], "no error bars"),
    ],
)
def test_a_caption_says_one_thing_of_each_kind_of_point_and_never_contradicts_itself(bands, caption):
    assert noise.band_caption(bands) == caption


def _noise_store(root: Path, cells: dict, ci: dict | None = None, sweep: dict | None = None) -> Path:
    """cells: {(objective, task, layer[, size]): [score per seed]}, size "nano" (2 layers, 1,000 non-embedding
    parameters) unless named ("tiny": 4,000); ci: the same keys -> (low, high) written on every seed's row (one-seed
    sweeps); sweep: sweep.yaml (default: the objectives of `cells` in order, the first the reference)."""
    sweep = sweep or {"objectives": [{"name": o} for o in dict.fromkeys(k[0] for k in cells)]}
    (root / "sweep.yaml").write_text(json.dumps(sweep))  # YAML reads JSON
    checkpoints, results = {}, []
    for key, values in cells.items():
        objective, task, layer, size = (*key, "nano")[:4]
        for seed, value in enumerate(values):
            fp = f"{objective}-{size}-{seed}"
            checkpoints[fp] = {
                "run": f"{objective}-{size}-s{seed}",
                "objective": objective,
                "size": size,
                "seed": seed,
                "step": 10,
                "total_steps": 10,
                "checkpoint": fp,
                "model_fingerprint": fp,
                "params_non_embedding": {"nano": 1000, "tiny": 4000}[size],
                "params_encoder": 1000,
                "hidden_size": 8,
                "layers": 2,
                "corpus_tokens": 10,
                "train_flops": 1e6,
                "val_loss": 5.0,
            }
            low, high = (ci or {}).get(key, (None, None))
            results.append(
                {
                    "model_fingerprint": fp,
                    "task": task,
                    "family": "glue",
                    "split": "validation",
                    "probe": "linear",
                    "layer": layer,
                    "relative_depth": layer / 2,
                    "pooling": "mean",
                    "metric": "accuracy",
                    "value": value,
                    "is_main": True,
                    "ci_low": low,
                    "ci_high": high,
                }
            )
    _write_jsonl(root / "checkpoints.jsonl", list(checkpoints.values()))
    _write_jsonl(root / "results" / "results.jsonl", results)
    return root


def test_differences_over_seeds_are_tested_by_welch_and_corrected_across_the_report(tmp_path):
    from scipy import stats as scipy_stats

    from crossbert_eval import stats as S

    cells = {
        ("mlm", "SST-2", 2): [0.60, 0.61, 0.62],
        ("crossbert", "SST-2", 2): [0.80, 0.81, 0.82],  # 20 points apart, std 1: beyond
        ("mlm", "STS-B", 2): [0.60, 0.62, 0.64],
        ("crossbert", "STS-B", 2): [0.61, 0.63, 0.65],  # 1 point, std 2: within
        ("mlm", "SST-2", 0): [0.50, 0.60, 0.70],
        ("crossbert", "SST-2", 0): [0.30, 0.31, 0.32],
        ("mlm", "STS-B", 0): [0.50, 0.51, 0.52],
        ("crossbert", "STS-B", 0): [0.50, 0.51, 0.52],
    }
    md = build_sweep_report(_noise_store(tmp_path, cells), plots=TABLES_ONLY).read_text()
    table = pd.read_csv(tmp_path / "tables" / "comparisons.csv").fillna({"objective": ""})
    verdict = {(r["comparison"], r["objective"], r["task"]): r["verdict"] for _, r in table.iterrows()}
    assert verdict[("crossbert - mlm", "", "SST-2")] == "beyond noise"
    assert verdict[("crossbert - mlm", "", "STS-B")] == "within noise"
    assert verdict[("last layer - layer 0", "mlm", "SST-2")] == "within noise"  # layer 0 spread 10 points over seeds
    assert verdict[("last layer - layer 0", "crossbert", "SST-2")] == "beyond noise"
    assert verdict[("last layer - layer 0", "mlm", "STS-B")] == "beyond noise"
    # each p-value is scipy's Welch test of the per-seed scores, and the adjusted ones Benjamini-Hochberg over all six
    row = table[(table["comparison"] == "crossbert - mlm") & (table["task"] == "SST-2")].iloc[0]
    welch = scipy_stats.ttest_ind([80.0, 81.0, 82.0], [60.0, 61.0, 62.0], equal_var=False)
    assert (
        row["diff"] == pytest.approx(20.0)
        and row["first_seeds"] == row["second_seeds"] == 3
        and row["p_value"] == pytest.approx(welch.pvalue)
    )
    assert (row["diff_ci_low"], row["diff_ci_high"]) == pytest.approx(tuple(welch.confidence_interval(0.95)))
    assert row["test"] == f"{S.WELCH} (3 vs 3)" and row["noise"] == S.SEED_NOISE
    assert table["p_adjusted"].to_numpy() == pytest.approx(scipy_stats.false_discovery_control(table["p_value"], method="bh"))
    assert ((table["verdict"] == "beyond noise") == (table["p_adjusted"] <= S.ALPHA)).all()
    assert (
        "**crossbert - mlm**: 1 of 2 differences are beyond noise (1 within it, 0 untested): nano SST-2:linear (+20.00, adjusted p"
        in md
    )
    assert "**last layer - layer 0**: 3 of 4 differences are beyond noise" in md
    methods = md.split("**Method.**")[1].split("\n")[0]
    assert "Welch t-test over seeds" in methods and "Benjamini-Hochberg over the 6 tested comparisons" in methods
    assert (
        "false-discovery rate 0.05" in methods
        and "a true difference of 2 standard deviations: with 3 seeds per side it is called in" in methods
    )


def test_with_one_seed_two_models_are_not_tested_against_each_other(tmp_path):
    """One seed per objective: the difference mixes the objective with the seed, and nothing measured covers the seed.
    The separate bootstrap intervals (evaluation noise) do not stand in for it."""
    from crossbert_eval.report.noise import UNTESTED

    cells = {
        ("mlm", "SST-2", 2): [0.60],
        ("crossbert", "SST-2", 2): [0.64],
        ("mlm", "STS-B", 2): [0.60],
        ("crossbert", "STS-B", 2): [0.70],
    }
    ci = {
        ("mlm", "SST-2", 2): (0.57, 0.63),
        ("crossbert", "SST-2", 2): (0.61, 0.67),
        ("mlm", "STS-B", 2): (0.58, 0.62),
        ("crossbert", "STS-B", 2): (0.68, 0.72),
    }
    md = build_sweep_report(_noise_store(tmp_path, cells, ci), plots=TABLES_ONLY).read_text()
    table = pd.read_csv(tmp_path / "tables" / "comparisons.csv")
    objectives = table[table["comparison"] == "crossbert - mlm"]
    assert (objectives["verdict"] == "unknown").all() and set(objectives["noise"]) == {UNTESTED["models"]}
    assert objectives["p_value"].isna().all() and objectives["test"].eq("none").all()
    assert "**crossbert - mlm**: 0 of 2 differences are beyond noise (0 within it, 2 untested)." in md
    scores = pd.read_csv(tmp_path / "tables" / "scores.csv")
    assert scores["score_ci_low"].notna().all()  # the intervals stay, as error bars


def test_with_one_seed_two_layers_of_one_model_are_compared_paired_and_labelled_evaluation_noise(tmp_path):
    """The last layer fixes 30 of layer 0's 260 errors on 872 examples: the two bootstrap intervals overlap,
    the paired bootstrap of the difference excludes 0. Without kept predictions there is no test."""
    from crossbert_eval import stats as S
    from crossbert_eval.probes import bootstrap_ci
    from crossbert_eval.report.noise import UNTESTED
    from crossbert_eval.results import ResultsStore

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 872)
    layer0 = np.where(np.arange(872) < 260, 1 - y, y)
    last = np.where(np.arange(872) < 230, 1 - y, y)
    cells, ci, kept = {}, {}, {}
    for objective in ("mlm", "crossbert"):
        for layer, pred in ((0, layer0), (2, last)):
            cells[(objective, "SST-2", layer)] = [float((pred == y).mean())]
            ci[(objective, "SST-2", layer)] = bootstrap_ci("accuracy", y, pred)
            kept[(objective, layer)] = pred
    root = _noise_store(tmp_path, cells, ci)
    rows = [json.loads(line) for line in (root / "results" / "results.jsonl").read_text().splitlines()]
    store = ResultsStore(root / "results")
    for i, row in enumerate(rows):
        row["unit"] = f"unit{i}"
        if row["model_fingerprint"].startswith("mlm"):  # crossbert's predictions were not kept (an older store)
            store.save_predictions(row["unit"], y, kept[("mlm", row["layer"])])
    _write_jsonl(root / "results" / "results.jsonl", rows)
    md = build_sweep_report(root, plots=TABLES_ONLY).read_text()
    table = pd.read_csv(root / "tables" / "comparisons.csv").set_index(["comparison", "objective"])
    paired = table.loc[("last layer - layer 0", "mlm")]
    assert paired["verdict"] == "beyond noise" and paired["test"] == S.PAIRED and paired["noise"] == S.EVALUATION_NOISE
    assert paired["diff"] == pytest.approx(100 * 30 / 872)
    assert 0 < paired["diff_ci_low"] < paired["diff"] < paired["diff_ci_high"]
    assert paired["p_adjusted"] == paired["p_value"] < S.ALPHA  # the only test of this report: a family of one
    unpaired = table.loc[("last layer - layer 0", "crossbert")]
    assert unpaired["verdict"] == "unknown" and unpaired["noise"] == UNTESTED["predictions"] and np.isnan(unpaired["diff_ci_low"])
    assert "(+3.44, adjusted p 0.002) [evaluation noise only]" in md


def test_the_reference_objective_comes_from_the_sweep_config(tmp_path):
    from crossbert_eval.report.loading import reference_objective

    assert reference_objective({"objectives": [{"name": "mlm15"}, {"name": "crossbert_cms"}]}) == "mlm15"  # the first listed
    assert (
        reference_objective(
            {"objectives": [{"name": "mlm15"}, {"name": "crossbert_cms"}], "reference_objective": "crossbert_cms"}
        )
        == "crossbert_cms"
    )
    assert reference_objective({}) is None
    cells = {(objective, "SST-2", 2): [0.6, 0.61, 0.62] for objective in ("mlm15", "crossbert_cms", "crossbert_nocms")}
    sweep = {
        "objectives": [{"name": o} for o in ("mlm15", "crossbert_cms", "crossbert_nocms")],
        "reference_objective": "crossbert_cms",
    }
    build_sweep_report(_noise_store(tmp_path, cells, sweep=sweep), plots=TABLES_ONLY)
    table = pd.read_csv(tmp_path / "tables" / "comparisons.csv")
    assert set(table["comparison"]) == {"crossbert_nocms - crossbert_cms", "mlm15 - crossbert_cms"}


def test_probes_on_transformed_features_are_tables_of_their_own_beside_the_raw_ones(tmp_path):
    cells = {(objective, "STS-B", 2): [0.6, 0.61, 0.62] for objective in ("mlm", "crossbert")}
    root = _noise_store(tmp_path, cells)
    rows = [json.loads(line) for line in (root / "results" / "results.jsonl").read_text().splitlines()]
    centred = [{**r, "feature_transform": "centred", "value": r["value"] + 0.1} for r in rows]
    _write_jsonl(root / "results" / "results.jsonl", [{**r, "feature_transform": "raw"} for r in rows] + centred)
    md = build_sweep_report(root, plots=TABLES_ONLY).read_text()
    sizes = pd.read_csv(root / "tables" / "summary_by_size.csv").set_index("objective")
    assert sizes.loc["mlm", "STS-B:linear"] == pytest.approx(61.0) and sizes.loc[
        "mlm", "STS-B:linear (centred)"
    ] == pytest.approx(71.0)
    columns = list(sizes.columns)
    assert columns.index("STS-B:linear (centred)") == columns.index("STS-B:linear") + 1  # side by side
    assert set(pd.read_csv(root / "tables" / "comparisons.csv")["probe"]) == {"linear", "linear (centred)"}
    assert "STS-B, linear probe (centred)" in md  # the column's header (vocabulary.label)


def test_geometry_rows_get_a_table_and_plots_but_stay_out_of_the_scores(sweep_root):
    from crossbert_eval.geometry import METRICS as metrics

    def add_geometry(rows):
        geo = []
        for r in rows:
            if r["task"] == "SST-2":
                for i, m in enumerate(metrics):
                    geo.append(
                        {
                            **r,
                            "probe": "geometry",
                            "metric": m,
                            "value": 1.0 + i + r["layer"] + 0.1 * r["value"],
                            "is_main": i == 0,
                        }
                    )
        return rows + geo

    _rewrite_results(sweep_root, add_geometry)
    md = build_sweep_report(sweep_root, plots=["geometry_depth", "geometry_size"]).read_text()
    assert "geometry" not in set(pd.read_csv(sweep_root / "tables" / "scores.csv")["probe"])
    geometry = pd.read_csv(sweep_root / "tables" / "geometry.csv")
    assert len(geometry) == len(metrics) * 2 * 2  # metrics x objectives x sizes
    row = geometry[(geometry["objective"] == "mlm") & (geometry["size"] == "tiny") & (geometry["metric"] == "anisotropy")].iloc[0]
    assert row["seeds"] == 2 and row["mean"] == pytest.approx(
        np.mean([1.0 + metrics.index("anisotropy") + 4 + 0.1 * _score("mlm", "tiny", s, "SST-2", 4, 100) for s in (0, 1)])
    )
    for name in ("geometry_depth", "geometry_size"):
        assert (sweep_root / "plots" / f"{name}.png").stat().st_size > 1000 and f"plots/{name}.png" in md
    assert "## Representation geometry" in md
    # RankMe and dataset entropy of raw and centred features side by side, seed means
    side_by_side = tables.centring_table(geometry).set_index(["task", "objective", "size"])
    assert list(side_by_side.columns) == [
        "dataset_entropy",
        "dataset_entropy_centred",
        "effective_rank",
        "effective_rank_centred",
    ]
    means = geometry.set_index(["task", "objective", "size", "metric"])["mean"]
    assert (
        side_by_side.loc[("SST-2", "mlm", "tiny"), "effective_rank_centred"]
        == means[("SST-2", "mlm", "tiny", "effective_rank_centred")]
    )
    assert "Raw and mean-centred features side by side" in md


def _loss_curve(objective: str, tokens_per_nat: float, seed: int = 0) -> list[dict]:
    """Checkpoints at 1M, 2M, 4M tokens whose shared loss falls one nat per doubling of tokens / tokens_per_nat:
    loss = 8 - log2(tokens / tokens_per_nat), so an objective with twice the tokens_per_nat needs twice the tokens."""
    return [
        {
            "run": f"{objective}-tiny-s{seed}",
            "objective": objective,
            "size": "tiny",
            "seed": seed,
            "step": t,
            "total_steps": 4,
            "corpus_tokens": t * 1_000_000,
            "train_flops": t * 1_000_000 * 6.0,
            "params_non_embedding": 1,
            "val_loss": 1.0,
            "shared_loss_r50": 8 - np.log2(t * 1_000_000 / tokens_per_nat),
        }
        for t in (1, 2, 4)
    ]


def test_sample_efficiency_is_the_token_ratio_at_equal_shared_loss():
    from crossbert_eval.report.tables import sample_efficiency

    # crossbert_nocms needs exactly 2x the tokens of crossbert_cms for any loss: its curve is the same, shifted one doubling.
    rows = pd.DataFrame(_loss_curve("crossbert_cms", 1.0) + _loss_curve("crossbert_nocms", 2.0))
    table = sample_efficiency(rows).set_index(["reference", "objective"])
    # CMS's final loss (at 4M) is reached by no-CMS only at 8M: past its last checkpoint, so not reached, never extrapolated
    assert np.isnan(table.loc[("crossbert_cms", "crossbert_nocms"), "tokens_ratio"])
    assert table.loc[("crossbert_cms", "crossbert_nocms"), "note"] == "not reached"
    # no-CMS's final loss (at 4M) is CMS's loss at 2M: CMS needs half the tokens, and half the FLOPs here
    assert table.loc[("crossbert_nocms", "crossbert_cms"), "tokens_ratio"] == pytest.approx(0.5)
    assert table.loc[("crossbert_nocms", "crossbert_cms"), "flops_ratio"] == pytest.approx(0.5)
    # a 1.5x shift lands between checkpoints: log-linear interpolation recovers it exactly on these curves
    rows = pd.DataFrame(_loss_curve("a", 1.0) + _loss_curve("b", 1.5))
    assert sample_efficiency(rows).set_index(["reference", "objective"]).loc[("b", "a"), "tokens_ratio"] == pytest.approx(1 / 1.5)


def test_sample_efficiency_averages_seeds_before_comparing():
    from crossbert_eval.report.tables import sample_efficiency

    seeds = _loss_curve("a", 1.0, seed=0) + _loss_curve("a", 4.0, seed=1)  # seed mean: shifted by a factor 2
    rows = pd.DataFrame(seeds + _loss_curve("b", 4.0))
    assert sample_efficiency(rows).set_index(["reference", "objective"]).loc[("b", "a"), "tokens_ratio"] == pytest.approx(0.5)


# -- the unigram plateau (crossbert_model.plateau) -------------------------------------------------------------


def _rewrite_checkpoints(root: Path, edit) -> None:
    path = root / "checkpoints.jsonl"
    _write_jsonl(path, [edit(json.loads(line)) for line in path.read_text().splitlines()])


def test_a_comparison_that_involves_a_run_on_the_unigram_plateau_gives_no_verdict(tmp_path):
    from crossbert_eval import stats as S

    cells = {
        ("mlm", "SST-2", 2): [0.60, 0.61, 0.62],
        ("crossbert", "SST-2", 2): [0.80, 0.81, 0.82],  # beyond noise, were both off
        ("mlm", "STS-B", 2): [0.60, 0.61, 0.62],
        ("crossbert", "STS-B", 2): [0.80, 0.81, 0.82],
        ("mlm", "SST-2", 0): [0.50, 0.51, 0.52],
        ("crossbert", "SST-2", 0): [0.50, 0.51, 0.52],
        ("mlm", "STS-B", 0): [0.50, 0.51, 0.52],
        ("crossbert", "STS-B", 0): [0.50, 0.51, 0.52],
    }
    root = _noise_store(tmp_path, cells)

    # every run 1.5 nats below the unigram entropy at its own ratio, but crossbert seed 1: 0.4 below, on the plateau;
    # flat MLM recorded its entropies as runs do now, CrossBERT's were filled in afterwards (`crossbert plateau`)
    def losses(row: dict) -> dict:
        new = {"mask_ratio": 0.15, "unigram_entropy_r15": 7.0} if row["objective"] == "mlm" else {}
        return {**row, **new, "shared_loss_r15": 5.5, "shared_loss_r50": 6.6 if row["run"] == "crossbert-nano-s1" else 5.5}

    _rewrite_checkpoints(root, losses)
    _write_jsonl(
        SweepDir(root).unigram_entropies,
        [
            {
                "run": f"crossbert-nano-s{seed}",
                "mask_ratio": 0.5,
                "unigram_entropy_r50": 7.0,
                "tokenizer": "tok",
                "smoothing": "add-one",
            }
            for seed in range(3)
        ],
    )
    md = build_sweep_report(root, plots=TABLES_ONLY).read_text()
    plateau = pd.read_csv(root / "tables" / "plateau.csv").set_index("run")
    off = {**{f"mlm-nano-s{s}": "yes" for s in range(3)}, **{f"crossbert-nano-s{s}": "no" if s == 1 else "yes" for s in range(3)}}
    assert plateau["off_plateau"].to_dict() == off
    assert plateau.loc["crossbert-nano-s1", "margin"] == pytest.approx(0.4) and plateau.loc["mlm-nano-s0", "own_ratio"] == 0.15
    table = pd.read_csv(root / "tables" / "comparisons.csv").fillna({"objective": ""})
    withheld = "not comparable: crossbert-nano-s1 on the unigram plateau"
    involving = table[(table["comparison"] == "crossbert - mlm") | (table["objective"] == "crossbert")]
    assert len(involving) == 4 and (involving["verdict"] == withheld).all()  # no verdict, the difference still shown
    assert involving[involving["comparison"] == "crossbert - mlm"]["diff"].tolist() == pytest.approx([20.0, 20.0])
    others = table[table["objective"] == "mlm"]
    assert len(others) == 2 and (others["verdict"] == "beyond noise").all()  # runs off the plateau keep their verdicts
    assert involving["p_adjusted"].isna().all() and involving["p_value"].notna().all()  # tested, but left out of the family
    assert (others["p_adjusted"] == S.adjusted(others["p_value"].to_numpy())).all()  # the family: the comparable two
    assert (
        "**crossbert - mlm**: 0 of 2 differences are beyond noise (0 within it, 0 untested, "
        "2 not comparable: a run on the unigram plateau)." in md
    )
    assert "## The unigram plateau" in md
    assert "| crossbert-nano-s1 | crossbert | nano | 1 | 0.500 | 6.600 | 7.000 | 0.400 | no |" in md


def test_a_comparison_with_a_crossbert_whose_encoder_does_not_carry_context_gives_no_verdict(tmp_path):
    cells = {
        ("mlm", "SST-2", 2): [0.60, 0.61, 0.62],
        ("crossbert", "SST-2", 2): [0.80, 0.81, 0.82],
        ("mlm", "SST-2", 0): [0.50, 0.51, 0.52],
        ("crossbert", "SST-2", 0): [0.50, 0.51, 0.52],
    }
    root = _noise_store(tmp_path, cells)
    # every run 2 nats below its unigram entropy, off the plateau; the order-blind encoder loses 1.0 nat of flat MLM's
    # margin and of CrossBERT seeds 0 and 2's, but only 0.2 nats (a tenth) of CrossBERT seed 1's
    _rewrite_checkpoints(root, lambda row: {**row, "mask_ratio": 0.15, "unigram_entropy_r15": 7.0, "shared_loss_r15": 5.0})
    _write_jsonl(
        SweepDir(root).reliance,
        [
            {
                "run": f"{o}-nano-s{s}",
                "step": 10,
                "reliance_loss": 5.0,
                "reliance_unigram_entropy": 7.0,
                "reliance_loss_bypassed": 6.9,
                "reliance_loss_order_blind": 5.2 if (o, s) == ("crossbert", 1) else 6.0,
                "identity_share_l0": 1.0,
                "swap_pooled_l0": 0.0,
                "swap_neighbour_l0": 0.0,
                "identity_share_l1": 0.5,
                "swap_pooled_l1": 0.3,
                "swap_neighbour_l1": 0.1,
            }
            for o in ("mlm", "crossbert")
            for s in range(3)
        ],
    )
    md = build_sweep_report(root, plots=TABLES_ONLY).read_text()
    reliance = pd.read_csv(root / "tables" / "encoder_reliance.csv").set_index("run")
    assert reliance.loc["crossbert-nano-s1", "order_blind_share"] == pytest.approx(0.1)
    assert reliance.loc["mlm-nano-s0", "order_blind_share"] == pytest.approx(0.5)
    assert reliance.loc["crossbert-nano-s0", "bypassed_share"] == pytest.approx(0.95)
    assert reliance["encoder_carries_context"].to_dict() == {
        **{f"mlm-nano-s{s}": "yes" for s in range(3)},
        **{f"crossbert-nano-s{s}": "no" if s == 1 else "yes" for s in range(3)},
    }
    plateau = pd.read_csv(root / "tables" / "plateau.csv").set_index("run")
    assert (plateau["off_plateau"] == "yes").all() and plateau.loc["crossbert-nano-s1", "encoder_carries_context"] == "no"
    layers = pd.read_csv(root / "tables" / "encoder_layers.csv")
    assert len(layers) == 12 and layers[layers["layer"] == 1]["identity_share"].eq(0.5).all()
    table = pd.read_csv(root / "tables" / "comparisons.csv").fillna({"objective": ""})
    objectives = table[table["comparison"] == "crossbert - mlm"]
    assert (objectives["verdict"] == "not comparable: crossbert-nano-s1 whose encoder does not carry context").all()
    assert (table[table["objective"] == "mlm"]["verdict"] != objectives["verdict"].iloc[0]).all()  # flat MLM's own tests stand
    assert "## Encoder reliance: does the encoder carry context?" in md
    assert "1 not comparable: a run whose encoder does not carry context" in md
    # the verdict opens the page, before any figure, and is written as summary.json
    assert md.index("## Verdict") < md.index("## Plots")
    assert (
        "- **crossbert - mlm**: 1 compared, 0 tested: 0 beyond noise, 0 within noise, 1 withheld: a run whose encoder "
        "does not carry context." in md
    )
    assert "- Runs whose encoder does not carry context: crossbert-nano-s1 (their comparisons are withheld)." in md
    summary = json.loads((root / "summary.json").read_text())
    assert summary["runs_failing"] == {"encoder_carries_context": ["crossbert-nano-s1"]}
    assert summary["comparisons"]["crossbert - mlm"]["withheld"] == {"off_plateau": 0, "encoder_carries_context": 1}


def test_the_encoder_rule_gives_no_answer_for_a_run_on_the_plateau():
    """A run 0.1 nats below its unigram entropy whose order-blind encoder loses all of it (a share of 1.0, of noise)
    and one 2 nats below that loses a tenth: unknown, then no."""
    runs = [("crossbert-nano-s0", 6.9, 7.0), ("crossbert-nano-s1", 5.0, 5.2)]
    checkpoints = pd.DataFrame(
        [
            {
                "run": run,
                "objective": "crossbert",
                "size": "nano",
                "seed": i,
                "step": 10,
                "params_non_embedding": 1,
                "reliance_loss": loss,
                "reliance_loss_order_blind": blind,
                "reliance_loss_bypassed": 7.0,
                "reliance_unigram_entropy": 7.0,
            }
            for i, (run, loss, blind) in enumerate(runs)
        ]
    )
    table = tables.encoder_reliance_table(checkpoints).set_index("run")
    assert table["order_blind_share"].to_list() == pytest.approx([1.0, 0.1])
    assert table["encoder_carries_context"].to_dict() == {"crossbert-nano-s0": "unknown", "crossbert-nano-s1": "no"}


def test_a_comparison_row_reads_in_its_label_s_order_on_the_page_and_in_the_csv(tmp_path):
    cells = {
        ("mlm", "SST-2", 2): [0.60, 0.61, 0.62],
        ("crossbert", "SST-2", 2): [0.80, 0.81, 0.82],
        ("mlm", "SST-2", 0): [0.50, 0.51, 0.52],
        ("crossbert", "SST-2", 0): [0.30, 0.31, 0.32],
    }
    md = build_sweep_report(_noise_store(tmp_path, cells), plots=TABLES_ONLY).read_text()
    table = noise.read_comparisons(tmp_path / "tables" / "comparisons.csv").fillna({"objective": ""})
    rows = {(r["comparison"], r["objective"]): r for _, r in table.iterrows()}
    objectives = rows[("crossbert - mlm", "")]
    assert (objectives["first"], objectives["second"]) == ("crossbert", "mlm")
    assert (objectives["first_mean"], objectives["second_mean"], objectives["diff"]) == pytest.approx((81.0, 61.0, 20.0))
    depth = rows[("last layer - layer 0", "crossbert")]
    assert (depth["first"], depth["second"], depth["first_mean"], depth["second_mean"]) == (
        "last layer",
        "layer 0",
        pytest.approx(81.0),
        pytest.approx(31.0),
    )
    header = next(line for line in md.splitlines() if line.startswith("| comparison |"))
    assert "| first | second | first: mean | second: mean | first - second |" in header and "a_mean" not in header
    assert "`first` is the last layer and `second` layer 0" in md  # the page says how a row reads


def test_a_comparison_table_written_before_the_sides_were_named_reads_in_the_new_names(tmp_path):
    old = tmp_path / "comparisons.csv"  # two rows as the old code wrote them: `b` was the label's first side
    old.write_text(
        "comparison,objective,size,task,probe,a_mean,b_mean,diff,diff_ci_low,diff_ci_high,a_std,b_std,a_seeds,b_seeds,"
        "test,noise,p_value,p_adjusted,verdict\n"
        "crossbert - mlm,,nano,SST-2,linear,57.1,55.3,-1.8,-4.0,0.4,0.3,1.5,3,3,Welch,seed variance,0.1,0.2,within noise\n"
        "larger size - smaller size,mlm,nano -> tiny,SST-2,linear,55.8,60.0,4.2,1.0,7.4,1.0,2.2,3,3,Welch,seed variance,0.02,0.04,"
        "beyond noise\n"
    )
    table = noise.read_comparisons(old)
    assert list(table.columns) == noise.COMPARISON_COLUMNS
    assert table[["first", "second"]].values.tolist() == [["crossbert", "mlm"], ["tiny", "nano"]]
    assert table["first_mean"].tolist() == [55.3, 60.0] and table["second_mean"].tolist() == [57.1, 55.8]
    assert table["diff"].tolist() == pytest.approx((table["first_mean"] - table["second_mean"]).tolist())


def test_the_collapse_gap_between_best_and_last_layer_is_tested_from_one_size_to_the_next(tmp_path):
    from scipy import stats as scipy_stats

    cells = {  # flat MLM: best layer 1 at both sizes; its last layer falls 2 points below it at nano, 10 at tiny
        ("mlm", "SST-2", 0, "nano"): [0.50, 0.50, 0.50],
        ("mlm", "SST-2", 1, "nano"): [0.70, 0.71, 0.72],
        ("mlm", "SST-2", 2, "nano"): [0.68, 0.69, 0.69],
        ("mlm", "SST-2", 0, "tiny"): [0.50, 0.50, 0.50],
        ("mlm", "SST-2", 1, "tiny"): [0.80, 0.81, 0.82],
        ("mlm", "SST-2", 2, "tiny"): [0.70, 0.71, 0.73],
    }
    root = _noise_store(tmp_path, cells)
    _rewrite_checkpoints(root, lambda row: {**row, "mask_ratio": 0.15, "unigram_entropy_r15": 7.0, "shared_loss_r15": 5.0})
    build_sweep_report(root, plots=TABLES_ONLY)
    table = pd.read_csv(root / "tables" / "comparisons.csv").fillna({"objective": ""})
    (row,) = table[table["comparison"] == "collapse gap (best - last layer): larger size - smaller size"].to_dict("records")
    nano, tiny = [2.0, 2.0, 3.0], [10.0, 10.0, 9.0]  # per seed: layer 1 minus layer 2, in points
    assert (row["first"], row["second"]) == ("tiny", "nano")  # in the label's order: the larger size minus the smaller
    assert row["first_mean"] == pytest.approx(sum(tiny) / 3) and row["second_mean"] == pytest.approx(sum(nano) / 3)
    assert row["p_value"] == pytest.approx(scipy_stats.ttest_ind(tiny, nano, equal_var=False).pvalue)
    assert row["size"] == "nano -> tiny" and row["verdict"] == "beyond noise"
    build_sweep_report(root, plots=["collapse_layers"])
    assert (root / "plots" / "collapse_layers.png").exists()  # the collapse view: last and best layer against size
    gaps = tables.layer_best(loading.load_scores(root)).set_index("size")
    assert gaps.loc["tiny", "best_layer"] == 1 and gaps.loc["tiny", "gap"] == pytest.approx(29 / 3)
    assert gaps.loc["nano", "gap_std"] == pytest.approx(float(pd.Series(nano).std()))


def test_a_committed_reference_with_its_store_xz_compressed_gives_the_same_report(tmp_path):
    import lzma

    cells = {("mlm", "SST-2", 2): [0.60, 0.61, 0.62], ("crossbert", "SST-2", 2): [0.80, 0.81, 0.82]}
    (tmp_path / "plain").mkdir(), (tmp_path / "packed").mkdir()
    plain = _noise_store(tmp_path / "plain", cells)
    build_sweep_report(plain, plots=TABLES_ONLY)
    packed = _noise_store(tmp_path / "packed", cells)
    store = packed / "results" / "results.jsonl"
    (packed / "results" / "results.jsonl.xz").write_bytes(lzma.compress(store.read_bytes()))
    store.unlink()  # what `make reference` leaves
    build_sweep_report(packed, plots=TABLES_ONLY)
    scores = [pd.read_csv(root / "tables" / "scores.csv") for root in (plain, packed)]
    assert len(scores[0]) == 6 and scores[0].equals(scores[1])


def test_each_objective_at_the_next_size_up_is_tested_against_the_size_below_unless_a_run_is_on_the_plateau(tmp_path):
    from scipy import stats as scipy_stats

    cells = {
        ("mlm", "SST-2", 2, "nano"): [0.60, 0.61, 0.62],
        ("mlm", "SST-2", 2, "tiny"): [0.70, 0.71, 0.72],  # 10 points up
        ("mlm", "STS-B", 2, "nano"): [0.60, 0.62, 0.64],
        ("mlm", "STS-B", 2, "tiny"): [0.61, 0.63, 0.65],  # within noise
        ("crossbert", "SST-2", 2, "nano"): [0.60, 0.61, 0.62],
        ("crossbert", "SST-2", 2, "tiny"): [0.40, 0.41, 0.42],
    }
    root = _noise_store(tmp_path, cells)

    def losses(row: dict) -> dict:  # every run 1.5 nats below the entropy, but crossbert-tiny-s1: 0.4, on the plateau
        on = row["run"] == "crossbert-tiny-s1"
        return {**row, "mask_ratio": 0.15, "unigram_entropy_r15": 7.0, "shared_loss_r15": 6.6 if on else 5.5}

    _rewrite_checkpoints(root, losses)
    md = build_sweep_report(root, plots=TABLES_ONLY).read_text()
    table = pd.read_csv(root / "tables" / "comparisons.csv").fillna({"objective": ""})
    sizes = table[table["comparison"] == "larger size - smaller size"].set_index(["objective", "task"])
    assert len(sizes) == 3 and set(sizes["size"]) == {"nano -> tiny"}  # the smaller size is the one with fewer parameters
    row = sizes.loc[("mlm", "SST-2")]
    assert row["diff"] == pytest.approx(10.0) and row["verdict"] == "beyond noise"
    assert row["p_value"] == pytest.approx(scipy_stats.ttest_ind([70.0, 71.0, 72.0], [60.0, 61.0, 62.0], equal_var=False).pvalue)
    assert sizes.loc[("mlm", "STS-B"), "verdict"] == "within noise"
    # 20 points down, but one seed of the larger CrossBERT has not left the plateau: no verdict, the difference shown
    assert sizes.loc[("crossbert", "SST-2"), "verdict"] == "not comparable: crossbert-tiny-s1 on the unigram plateau"
    assert sizes.loc[("crossbert", "SST-2"), "diff"] == pytest.approx(-20.0)
    assert (
        "**larger size - smaller size**: 1 of 3 differences are beyond noise" in md
        and "mlm nano -> tiny SST-2:linear (+10.00" in md
    )


def test_the_loss_plots_draw_the_unigram_entropy_of_their_targets(tmp_path, monkeypatch):
    figures = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, out, name, caption="": figures.setdefault(name, fig) and [])
    curves = pd.DataFrame(
        [
            {**row, "unigram_entropy_val": 7.5, "unigram_entropy_r50": 7.25}
            for row in _loss_curve("crossbert", 1.0) + _loss_curve("mlm", 2.0)
        ]
    )
    plots.plot_losses(curves, tmp_path)
    for ax in figures["losses"].axes:
        level = 7.25 if "r = 0.5" in ax.get_title() else 7.5
        lines = {line.get_label(): line.get_ydata()[0] for line in ax.get_lines()}
        assert lines["unigram entropy (plateau)"] == level, ax.get_title()
    # runs whose targets differ (here: another tokenizer for flat MLM) get a line each, in their colour
    curves.loc[curves["objective"] == "mlm", "unigram_entropy_r50"] = 6.0
    assert plots.plateau_levels(curves, "shared_loss_r50") == [
        (7.25, "unigram entropy (plateau), crossbert", plots.color_for("crossbert")),
        (6.0, "unigram entropy (plateau), mlm", plots.color_for("mlm")),
    ]


# -- the report as a library: colours passed in, captions returned, no state kept between builds ------------------


def test_a_plot_draws_in_the_colours_it_is_given_and_returns_its_caption(tmp_path):
    curves = pd.DataFrame(_loss_curve("crossbert", 1.0) + _loss_curve("mlm", 2.0))
    colors = {"crossbert": "#000001", "mlm": "#000002"}
    made = plots.plot_losses(curves, tmp_path, colors)
    assert [p.name for p in made] == ["losses", "losses_flops"] and all(p.png.is_file() and p.svg.is_file() for p in made)
    assert all(p.caption == "no error bars (1 seed, no interval)" for p in made)  # what the page prints
    figures = {}
    original = plots.save_figure
    try:  # the figure itself, before it is saved and closed
        plots.save_figure = lambda fig, out, name, caption="": figures.setdefault(name, fig) and []
        plots.plot_losses(curves, tmp_path, colors)
    finally:
        plots.save_figure = original
    drawn = {bars.get_label().split(" ")[0]: bars.lines[0].get_color() for ax in figures["losses"].axes for bars in ax.containers}
    assert drawn == colors  # each run's line (an errorbar: its data line) in its objective's colour


def test_the_default_palette_cannot_be_patched():
    with pytest.raises(TypeError):
        plots.OBJECTIVE_COLORS["mlm"] = "#000000"  # a zoo passes its own palette instead (zoo_report.family_palette)
    from crossbert_eval.report.zoo_report import family_palette

    palette = family_palette(["BERT", "mlm"])
    assert palette["mlm"] != plots.OBJECTIVE_COLORS["mlm"] and palette["crossbert"] == plots.OBJECTIVE_COLORS["crossbert"]
    assert plots.UNLISTED_COLOR not in (palette["BERT"], palette["mlm"])  # grey is kept for lines the palette does not name


def test_the_page_title_and_the_empty_comparison_line_are_parameters():
    assert "<title>zoo report</title>" in markdown.render_html("# x", title="zoo report")
    assert noise.noise_paragraph(pd.DataFrame(), "nothing to compare here") == "nothing to compare here"
    assert noise.noise_paragraph(pd.DataFrame()) == noise.NO_COMPARISONS
    plot = plots.Plot("collapse", Path("plots/collapse.png"), Path("plots/collapse.svg"), "error bars: none")
    assert markdown.plot_section([plot]) == ["![collapse](plots/collapse.png)\n\n*collapse: error bars: none*\n"]


# -- a report a person reads: a real Markdown renderer, plots first, one vocabulary ---------------------

from crossbert_eval.report import vocabulary  # noqa: E402


def _figures(monkeypatch) -> dict:
    """The figures the plot functions draw, by name, before they are saved and closed."""
    figures: dict = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, out, name, caption="": figures.setdefault(name, fig) and [])
    return figures


def test_the_page_is_rendered_by_a_markdown_library_and_every_table_scrolls_in_its_own_box():
    page = markdown.render_html(
        "Some **bold** and `code`.\n\n| a | b |\n|---|---|\n| 1 | x \\| y |\n\n<script>alert(1)</script>\n"
    )
    assert "<strong>bold</strong>" in page and "<code>code</code>" in page  # not `**bold**` shown literally
    assert '<div class="table-wrap"><table>' in page and "</table></div>" in page
    assert ".table-wrap{overflow-x:auto" in page  # a wide table scrolls inside its wrapper, not the page
    assert "<td>x | y</td>" in page  # a pipe in a cell stays in its cell
    assert "<script>" not in page  # raw HTML in a report's text is escaped, never run


def test_the_plots_come_before_the_tables(sweep_root):
    md = build_sweep_report(sweep_root, plots=["collapse"]).read_text()
    assert md.index("## Plots") < md.index("plots/collapse.png") < md.index("\n| ")
    page = (sweep_root / "report.html").read_text()
    assert page.index("<img") < page.index("<table>")


def test_table_headers_use_the_vocabulary_and_show_a_mean_with_its_spread_in_one_cell(sweep_root):
    md = build_sweep_report(sweep_root, plots=TABLES_ONLY).read_text()
    header = next(line for line in md.splitlines() if line.startswith("| objective | size |"))
    assert "| GLUE average, linear probe |" in header and "glue_linear" not in header and "_std" not in header
    per_seed = [100 * np.mean([_score("mlm", "tiny", s, t, 4, 100) for t in ("SST-2", "STS-B")]) for s in (0, 1)]
    assert f"{np.mean(per_seed):.2f} ± {np.std(per_seed, ddof=1):.2f}" in md


def test_loss_vs_probe_draws_the_loss_of_each_run_against_its_probe_score(sweep_root, monkeypatch):
    from crossbert_eval.report.loading import load_scores

    figures = _figures(monkeypatch)
    summary = tables.summarise(load_scores(sweep_root))
    plots.plot_loss_vs_probe(summary, sweep_root / "plots", averaged={"glue_linear": ["SST-2", "STS-B"]})
    (ax,) = [a for a in figures["loss_vs_probe"].axes]
    final = summary[summary["is_final"]]
    drawn = sorted(tuple(xy) for c in ax.collections for xy in c.get_offsets())
    assert drawn == sorted(zip(final["val_loss"], final["glue_linear"]))  # one point per run: (its loss, its score)
    assert len(drawn) == 2 * 2 * 2  # objectives x sizes x seeds
    assert ax.get_xlabel().startswith(vocabulary.axis_label("val_loss"))
    assert ax.get_ylabel() == "GLUE average, linear probe over 2 tasks (points)"
    colours = {tuple(np.round(c.get_facecolor()[0][:3], 3)) for c in ax.collections}
    assert len(colours) == 2  # coloured by objective


def test_a_panel_is_titled_by_what_it_holds_and_every_score_axis_is_named_alike(sweep_root, monkeypatch):
    from crossbert_eval.report.loading import load_scores

    figures = _figures(monkeypatch)
    scores = load_scores(sweep_root)
    scores = scores[scores["task"] != "Banking77Classification"]  # the MTEB average now holds one task
    averaged = tables.averaged_tasks(scores)
    assert averaged["mteb_avg"] == ["STSBenchmark"] and averaged["glue_linear"] == ["SST-2", "STS-B"]
    plots.plot_collapse(tables.by_size(tables.summarise(scores)), sweep_root / "plots", averaged=averaged)
    plots.plot_layerwise(scores, sweep_root / "plots")
    axes = figures["collapse"].axes
    assert [ax.get_title() for ax in axes[:2]] == ["GLUE average, linear probe over 2 tasks", "STSBenchmark (MTEB)"]
    layer_axes = [ax for ax in figures["layerwise"].axes if ax.get_title()]
    assert "SST-2, linear probe (main)" in [ax.get_title() for ax in layer_axes]
    assert {ax.get_ylabel() for ax in [*axes, *layer_axes] if ax.get_ylabel()} == {vocabulary.axis_label("score")}


def test_geometry_size_names_each_panel_s_metric_on_its_y_axis_in_the_vocabulary_s_words(monkeypatch):
    from crossbert_eval.geometry import METRICS

    figures = _figures(monkeypatch)
    geo = pd.DataFrame(
        [
            {
                "objective": o,
                "size": s,
                "seed": 0,
                "params_non_embedding": p,
                "task": "SST-2",
                "metric": m,
                "score": 1.0 + i,
                "is_final": True,
                "is_last_layer": True,
            }
            for o in ("mlm", "crossbert")
            for s, p in (("nano", 1e5), ("tiny", 4e5))
            for i, m in enumerate(METRICS)
        ]
    )
    plots.plot_geometry_size(geo, Path("unused"))
    named = {ax.get_title(): ax.get_ylabel() for ax in figures["geometry_size"].axes if ax.get_title()}
    assert named == {f"SST-2: {vocabulary.label(m)}": vocabulary.axis_label(m) for m in METRICS}
    assert not any("_" in text for pair in named.items() for text in pair)  # no raw key such as dataset_entropy_normalised
    assert vocabulary.axis_label("dataset_entropy") == "dataset entropy (nats)"
    (legend,) = figures["geometry_size"].legends
    assert [t.get_text() for t in legend.get_texts()] == ["crossbert", "mlm"] and legend.get_texts()[0].get_fontsize() >= 10


def test_point_labels_are_readable_and_close_points_get_labels_that_do_not_cover_each_other():
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(4.6, 3.4), layout="constrained")
    points = [(1e5, 50.0, "tiny-mlm"), (1e5, 50.4, "tiny-crossbert"), (1e5, 50.8, "tiny-third"), (1e7, 80.0, "MiniLM-L6")]
    ax.plot([p[0] for p in points], [p[1] for p in points], "o")
    plots.log_x_axis(ax)
    ax.set_xlabel("x")
    plots.label_points(ax, points)
    fig.suptitle("a title\nand a caption")  # the layout shrinks the axes after the labels are placed
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    boxes = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts}
    sizes = [t.get_fontsize() for t in ax.texts]
    plt.close(fig)
    assert sorted(boxes) == sorted(p[2] for p in points)
    assert min(sizes) >= 9  # points: the 6- and 7-point labels were too small to read
    names = sorted(boxes)
    assert not [(a, b) for i, a in enumerate(names) for b in names[i + 1 :] if boxes[a].overlaps(boxes[b])]
    assert boxes["MiniLM-L6"].x1 <= fig.bbox.width  # a point at the right edge is labelled on its left, inside the figure


def test_the_collapse_plots_label_their_points_at_the_readable_size(sweep_root, monkeypatch):
    from crossbert_eval.report.loading import load_scores

    figures = _figures(monkeypatch)
    plots.plot_collapse(tables.by_size(tables.summarise(load_scores(sweep_root))), sweep_root / "plots")
    texts = [t for ax in figures["collapse"].axes for t in ax.texts]
    assert {t.get_text() for t in texts} == set(SIZES) and all(t.get_fontsize() >= 9 for t in texts)


def test_runs_with_one_checkpoint_get_one_line_on_sample_efficiency_not_empty_rows(sweep_root):
    checkpoints = [json.loads(line) for line in (sweep_root / "checkpoints.jsonl").read_text().splitlines()]
    one_each = [{**c, "shared_loss_r50": 7.0 - 0.1 * c["layers"]} for c in checkpoints if c["step"] == c["total_steps"]]
    _write_jsonl(sweep_root / "checkpoints.jsonl", one_each)
    assert tables.sample_efficiency(loading.load_checkpoints(sweep_root)).empty
    md = build_sweep_report(sweep_root, plots=TABLES_ONLY).read_text()
    assert tables.ONE_CHECKPOINT_LINE in md and "## Sample efficiency (shared-protocol loss)" not in md


# -- `crossbert report` on any results store: each model's layer curves with their intervals -----------------------


def _probe_store(folder: Path) -> list[dict]:
    """A `crossbert probe --results FOLDER` store of two models (what probe_runner writes: one row per task x layer,
    with the bootstrap interval), and no sweep or zoo files."""
    rows = []
    for model, base in (("runs/tiny-mlm/step_000400", 0.6), ("sentence-transformers/all-MiniLM-L6-v2", 0.8)):
        for layer in range(3):
            value = base + 0.02 * layer
            rows.append(
                {
                    "model": model,
                    "model_fingerprint": model[-6:],
                    "task": "SST-2",
                    "family": "glue",
                    "split": "validation",
                    "probe": "linear",
                    "feature_transform": "raw",
                    "layer": layer,
                    "relative_depth": layer / 2,
                    "pooling": "mean",
                    "seed": 0,
                    "metric": "accuracy",
                    "value": value,
                    "is_main": True,
                    "ci_low": value - 0.03,
                    "ci_high": value + 0.01,
                    "unit": f"{model}-{layer}",
                }
            )
    _write_jsonl(folder / "results.jsonl", rows)
    return rows


def test_crossbert_report_of_a_probe_results_folder_draws_each_model_s_layer_curve_with_its_interval(
    tmp_path, monkeypatch, capsys
):
    from crossbert_eval.cli import main

    _probe_store(tmp_path)
    main(["report", str(tmp_path)])
    assert f"report: {tmp_path / 'report.md'}" in capsys.readouterr().out
    assert (tmp_path / "plots" / "layers.png").stat().st_size > 1000 and (tmp_path / "report.html").is_file()
    md = (tmp_path / "report.md").read_text()
    assert md.index("plots/layers.png") < md.index("\n| ")
    assert "| runs/tiny-mlm/step_000400 | SST-2 | linear | accuracy | 60.00 [57.00, 61.00] | 62.00 [59.00, 63.00] |" in md
    table = pd.read_csv(tmp_path / "tables" / "layers.csv")
    assert set(table["band"]) == {"bootstrap"} and len(table) == 6

    figures = _figures(monkeypatch)
    from crossbert_eval.report import store_report

    monkeypatch.setattr(store_report, "save_figure", plots.save_figure)
    store_report.plot_model_layers(table, tmp_path / "plots")
    (ax,) = [a for a in figures["layers"].axes if a.get_title()]
    assert ax.get_title() == "SST-2, linear probe (accuracy)" and ax.get_xlabel() == vocabulary.axis_label("layer")
    bars = {c.get_label(): c for c in ax.containers}
    assert set(bars) == {"runs/tiny-mlm/step_000400", "sentence-transformers/all-MiniLM-L6-v2"}
    segments = bars["runs/tiny-mlm/step_000400"].lines[2][0].get_segments()
    assert [tuple(np.round(s[:, 1], 6)) for s in segments] == [(57.0, 61.0), (59.0, 63.0), (61.0, 65.0)]  # ci_low..ci_high


def test_report_of_a_folder_without_results_is_one_clear_line(tmp_path):
    from crossbert_eval.report.store_report import build_report

    with pytest.raises(ReportError, match="no results.jsonl"):
        build_report(tmp_path)
    assert not (tmp_path / "report.md").exists()
