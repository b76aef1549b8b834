"""A sweep folder's report: tables/, plots/, report.md and report.html, rebuilt from the files the sweep wrote.

Outputs: tables/{scores,summary,summary_by_size,plateau,comparisons,geometry,sample_efficiency}.{csv,parquet},
plots/*.{png,svg}, report.md, report.html. Every plot draws error bars over seeds (the rule: noise.seed_bands) and says
which in its title and caption; `comparisons` tests which differences the report makes are beyond noise (the test,
alpha and correction: crossbert_eval.stats), and gives no verdict where a run is still on the unigram plateau
(crossbert_model.plateau): `plateau` says which.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from crossbert_model.plateau import PLATEAU_MARGIN
from crossbert_model.reliance import ENCODER_RELIANCE_SHARE
from crossbert_model.utils import atomic_write_text, json_text, provenance
from crossbert_model.readers import read_text

from ..folder_layout import SweepDir
from ..results import RESULTS_FILE, ResultsStore
from .loading import (
    LOSS_COLUMNS,
    skipped_runs,
    ReportError,
    load_baselines,
    load_checkpoints,
    load_geometry,
    load_scores,
    read_result_rows,
    reference_objective,
    results_path,
    smoke_notice,
    sweep_config,
    SMOKE_TEST_KEY,
)
from .markdown import (
    averages_sentence,
    baselines_section,
    centring_section,
    duplicates_warning,
    markdown_table,
    page_ending,
    plot_section,
    render_html,
    with_baseline_rows,
)
from .noise import comparisons, methods_paragraph, noise_paragraph, verdict_lines, verdict_summary, withheld_notice
from .staging import staged_report, write_table
from .plots import (
    Plot,
    check_plot_names,
    figure_notice,
    plot_collapse,
    plot_collapse_layers,
    plot_geometry_depth,
    plot_geometry_size,
    plot_geometry_training,
    plot_layerwise,
    plot_losses,
    plot_loss_vs_probe,
    plot_training,
)
from .tables import (
    ONE_CHECKPOINT_LINE,
    averaged_tasks,
    baseline_rows,
    by_size,
    encoder_layers_table,
    encoder_reliance_table,
    geometry_seed_table,
    layer_best,
    plateau_table,
    sample_efficiency,
    redundant_averages,
    several_checkpoints,
    summarise,
    uninformative_tasks,
)

log = logging.getLogger("crossbert_eval.report")


# Each plot of a sweep report by name, with the function that draws it (training, losses and geometry_training draw
# two files each: against tokens and against FLOPs, the second suffixed _flops).
SWEEP_PLOTS = {
    "collapse": lambda d: plot_collapse(d.sizes, d.out, averaged=d.averaged, baselines=d.baselines),
    "loss_vs_probe": lambda d: plot_loss_vs_probe(d.summary, d.out, d.checkpoints, averaged=d.averaged),
    "collapse_layers": lambda d: plot_collapse_layers(layer_best(d.scores), d.sizes, d.out, baselines=d.baselines),
    "layerwise": lambda d: plot_layerwise(d.scores, d.out, baselines=d.baselines),
    "training": lambda d: plot_training(d.scores, d.out, baselines=d.baselines),
    "losses": lambda d: plot_losses(d.checkpoints, d.out),
    "geometry_depth": lambda d: plot_geometry_depth(d.geo, d.out),
    "geometry_size": lambda d: plot_geometry_size(d.geo, d.out),
    "geometry_training": lambda d: plot_geometry_training(d.geo, d.out),
}


def build_sweep_report(root: Path, plots: Collection[str] | None = None) -> Path | None:
    """Tables, plots, report.md and report.html of a sweep folder; returns report.md's path, or None
    (nothing written) while the sweep has no scores yet. Not a sweep folder: ReportError.

    `plots`: the names (SWEEP_PLOTS) of the plots to draw, and so the only ones the page shows; None, the
    default and what `crossbert report` does, draws every one. Tables and the page's text do not depend on it."""
    root = Path(root)
    check_plot_names(plots, SWEEP_PLOTS)
    folder = SweepDir(root)
    if not (results_path(root).is_file() or folder.config.is_file()):
        raise ReportError(f"{root}: not a sweep folder (no results/{RESULTS_FILE} or {folder.config.name})")
    rows = read_result_rows(root)
    scores = load_scores(root, rows)
    if scores.empty:
        log.info("report: no scores yet under %s", root)
        return None
    with staged_report(folder) as stage:  # every file whole, or the previous report untouched (staging)
        _write_sweep_report(root, stage, rows, scores, plots)
    return folder.report


def _write_sweep_report(
    root: Path, stage: SweepDir, rows: list[dict], scores: pd.DataFrame, plots: Collection[str] | None
) -> None:
    """The report of `root`, read from `root` and written into `stage`, the folder staged_report moves into place."""
    tables = stage.tables
    baselines = load_baselines(root)
    uninformative = uninformative_tasks(scores, baselines)
    summary = summarise(scores, uninformative)
    sizes = by_size(summary)
    geo = load_geometry(root, rows)
    checkpoints = load_checkpoints(root)
    plateau = plateau_table(checkpoints)
    reference = reference_objective(sweep_config(root))
    extras = {
        "plateau": plateau,
        "encoder_reliance": encoder_reliance_table(checkpoints),
        "encoder_layers": encoder_layers_table(checkpoints),
        "comparisons": comparisons(
            scores, reference, ResultsStore(SweepDir(root).results).load_predictions, plateau, across_sizes=True
        ),
        "geometry": geometry_seed_table(geo),
        "sample_efficiency": sample_efficiency(checkpoints, plateau=plateau),
        "skipped": skipped_runs(root, checkpoints),
        "baselines": baselines,
    }
    for name, df in (("scores", scores), ("summary", summary), ("summary_by_size", sizes), *extras.items()):
        write_table(df, tables, name)
    averaged = averaged_tasks(scores, uninformative)
    data = SimpleNamespace(
        sizes=sizes,
        summary=summary,
        scores=scores,
        checkpoints=checkpoints,
        geo=geo,
        averaged=averaged,
        baselines=baselines,
        out=stage.plots,
    )
    verdict = verdict_summary(extras["comparisons"], plateau)
    with figure_notice(withheld_notice(verdict)):
        drawn = [plot for name, draw in SWEEP_PLOTS.items() if plots is None or name in plots for plot in draw(data)]
    extras["uninformative"] = uninformative
    extras["redundant"] = redundant_averages(averaged)
    extras["averaged"] = averaged
    extras["baseline_rows"] = baseline_rows(
        [c for c in sizes.columns if (c.startswith(("glue_", "mteb_")) or ":" in c) and not c.endswith(("_std", "_min", "_max"))],
        baselines,
        averaged,
    )
    notice = smoke_notice(sweep_config(root))
    verdict = {SMOKE_TEST_KEY: notice, **verdict} if notice else verdict
    atomic_write_text(stage.summary, json_text(verdict, indent=2) + "\n")
    extras["verdict"] = verdict
    md = render_sweep_markdown(root, sizes, summary, scores, drawn, duplicates_warning(rows), extras)
    atomic_write_text(stage.report, md)
    atomic_write_text(stage.report_html, render_html(md))


def render_sweep_markdown(
    root: Path,
    sizes: pd.DataFrame,
    summary: pd.DataFrame,
    scores: pd.DataFrame,
    plots: list[Plot],
    warning: str | None = None,
    extras: dict | None = None,
) -> str:
    prov = provenance()  # of the report build; each row carries its own (git_revision, packages)
    config = SweepDir(root).config
    sweep_yaml = read_text(config, "the sweep's config") if config.exists() else ""
    extras = extras or {}
    score_cols = [
        c for c in sizes.columns if (c.startswith(("glue_", "mteb_")) or ":" in c) and not c.endswith(("_std", "_min", "_max"))
    ]
    with_std = [x for c in score_cols for x in (c, f"{c}_std")]
    losses = [c for c in LOSS_COLUMNS if c in sizes.columns]
    shown = sizes[["objective", "size", "params_non_embedding", "train_flops", *losses, *with_std, "seeds"]]
    shown = shown.drop(columns=[x for c in extras.get("redundant", []) for x in (c, f"{c}_std")], errors="ignore")
    best_layers = layer_best(scores)
    compared = extras.get("comparisons", pd.DataFrame())
    plateau = extras.get("plateau", pd.DataFrame())
    reliance = extras.get("encoder_reliance", pd.DataFrame())
    geometry = extras.get("geometry", pd.DataFrame())
    efficiency = extras.get("sample_efficiency", pd.DataFrame())
    notice = smoke_notice(sweep_config(root))
    parts = [
        f"# Sweep report: {root.name}",
        "",
        *([f"**{notice}**", ""] if notice else []),
        *([f"**{warning}**", ""] if warning else []),
        *_skipped_line(extras.get("skipped", pd.DataFrame())),
        *(
            [
                "## Verdict",
                "",
                *verdict_lines(extras["verdict"]),
                "",
                "The figures below show every score; where a comparison is withheld above, its lines are not evidence either way.",
                "",
            ]
            if "verdict" in extras
            else []
        ),
        "Scores are points (x100) of each task's main metric, frozen encoder, mean pooling; last layer unless said.",
        "",
        "## Plots",
        "",
        *plot_section(plots),
        *baselines_section(extras.get("baselines", pd.DataFrame()), extras.get("uninformative", {})),
        "## Final checkpoints by size",
        "",
        f"{averages_sentence(extras.get('averaged', {}), extras.get('redundant', []))} "
        "The native validation loss is the masked-token cross-entropy of each objective on its own task (MLM at its ratio with "
        "BERT's 80/10/10, CrossBERT at its mask ratio): it ranks sizes within an objective, not objectives against each other. "
        "The shared-protocol losses (r = 0.15, r = 0.5; crossbert_model/shared_loss.py: the same seeded masks at 15% / 50%, "
        "every selected token [MASK] for MLM, only the unselected tokens visible to CrossBERT's encoder): compare objectives by these.",
        "",
        markdown_table(with_baseline_rows(shown, extras.get("baseline_rows", pd.DataFrame()))),
        "",
        "Each score: mean ± standard deviation over seeds (the mean alone with one seed); `seeds`: how many seeds each mean averages.",
        "",
        "## Last layer vs best layer (final checkpoints)",
        "",
        markdown_table(best_layers),
        "",
        *(
            [
                "## The unigram plateau",
                "",
                "A model that knows token frequencies and nothing else scores the unigram entropy of the targets "
                "(crossbert_model/plateau.py: add-one-smoothed unigram counts of the run's training sequences). A run is off the "
                f"plateau when its shared-protocol loss at its own training ratio is at least {PLATEAU_MARGIN:g} nats below the "
                "unigram entropy of the same targets; a comparison that involves a run on the plateau gives no verdict "
                "below (`not comparable`). `unknown`: the run recorded no unigram entropy (runs trained before it was recorded: "
                "`crossbert plateau SWEEP_DIR` fills it in).",
                "",
                markdown_table(plateau, floatfmt="{:.3f}"),
                "",
            ]
            if len(plateau)
            else []
        ),
        *_reliance_section(reliance, extras.get("encoder_layers", pd.DataFrame())),
        "## Which differences are beyond noise",
        "",
        f"Objectives: {_objectives_compared(reference_objective(sweep_config(root)))}; depth: layer 0 against the last layer "
        "of each objective and size; size: each objective's last layer at the next size up against the size below. "
        "The plots' error bars describe the spread; this table tests it.",
        "",
        methods_paragraph(compared),
        "",
        noise_paragraph(compared),
        "",
        markdown_table(compared),
        "",
        *_efficiency_section(efficiency, summary),
        *(
            [
                "## Representation geometry (final checkpoints, last layer)",
                "",
                "Mean and std over seeds of each metric of crossbert_eval.geometry on the tasks' evaluation texts "
                "(pair tasks: both sentences, each encoded alone).",
                "",
                *centring_section(geometry),
                markdown_table(geometry, floatfmt="{:.4f}"),
                "",
            ]
            if len(geometry)
            else []
        ),
        "## Every checkpoint",
        "",
        markdown_table(summary.drop(columns=["total_steps"], errors="ignore")),
        "",
        *page_ending(
            root,
            sweep_yaml,
            prov,
            "Tables: `tables/scores.csv` (every score row joined with its checkpoint), `tables/summary.csv`, "
            "`tables/summary_by_size.csv`, `tables/plateau.csv`, `tables/encoder_reliance.csv`, `tables/encoder_layers.csv`, `tables/comparisons.csv`, `tables/geometry.csv` (also as parquet).",
        ),
    ]
    return "\n".join(parts) + "\n"


def _skipped_line(skipped: pd.DataFrame) -> list[str]:
    if skipped.empty:
        return []
    runs = ", ".join(
        f"{r.run} (predicted {r.predicted_s:.0f} s, {r.left_s:.0f} s left)"
        if pd.notna(r.predicted_s)
        else f"{r.run} (no time left)"
        for r in skipped.itertuples()
    )
    return [
        f"**Not in this report: {len(skipped)} run(s) skipped for the sweep's wall budget (`budget_s`)**: {runs}. "
        "Run the sweep again (with more time) to add them; `tables/skipped.csv`.",
        "",
    ]


def _reliance_section(reliance: pd.DataFrame, layers: pd.DataFrame) -> list[str]:
    """The encoder-reliance table and its rule, beside the plateau (nothing for runs measured before it existed)."""
    if reliance.empty:
        return []
    per_layer = (
        layers.groupby(["objective", "size", "layer"])[["identity_share", "swap_pooled_change"]].mean().reset_index()
        if len(layers)
        else pd.DataFrame()
    )
    return [
        "## Encoder reliance: does the encoder carry context?",
        "",
        "The plateau certifies encoder and predictor together; the probes freeze the encoder alone. On the same "
        "shared-protocol sequences and targets, at each run's own ratio: the loss as trained, with the encoder made "
        "order-blind (its positions removed; a predictor keeps its own) and with its blocks bypassed "
        "(crossbert_model/reliance.py). The encoder rule: the encoder carries context when the order-blind encoder loses "
        f"at least {ENCODER_RELIANCE_SHARE:g} of the run's margin below the unigram entropy (`order_blind_share`); a "
        "comparison that involves a run failing it gives no verdict below, as for the plateau. A run whose margin is "
        f"under the plateau's {PLATEAU_MARGIN:g} nats gets no answer (`unknown`): a share of a margin that small is noise.",
        "",
        markdown_table(reliance, floatfmt="{:.3f}"),
        "",
        *(
            [
                "Per layer (seed means; every run in `tables/encoder_layers.csv`): `identity_share` is the share of the "
                "states' variance that token identity explains (adjusted R^2 over token ids), `swap_pooled_change` how far a "
                "sequence's mean-pooled state moves when two adjacent tokens swap, as a share of the typical distance between "
                "sequences' pooled states (0 at an order-blind layer).",
                "",
                markdown_table(per_layer, floatfmt="{:.3f}"),
                "",
            ]
            if len(per_layer)
            else []
        ),
    ]


def _efficiency_section(efficiency: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    """The sample-efficiency table, or one line saying why there is none (runs with one checkpoint each)."""
    if len(efficiency):
        return [
            "## Sample efficiency (shared-protocol loss)",
            "",
            "Corpus tokens each objective needs to reach the reference objective's final shared-protocol loss "
            "(seed means, interpolated in log tokens between checkpoints, never extrapolated: `note` says when the target "
            "lies below the first checkpoint or was not reached). `flops_ratio` is the same in training FLOPs.",
            "",
            markdown_table(efficiency, floatfmt="{:.3f}"),
            "",
        ]
    if len(summary) and not several_checkpoints(summary):
        return ["## Sample efficiency", "", ONE_CHECKPOINT_LINE, ""]
    return []


def _objectives_compared(reference: str | None) -> str:
    if reference is None:
        return "none compared (no sweep.yaml names the objectives)"
    return (
        f"every objective against the reference objective `{reference}` (the sweep config's `reference_objective`, else "
        "its first objective), per size, task and probe (last layer)"
    )
