"""The one owner of the layout of a sweep's and a zoo's folder: every file and sub-folder name, for the writers (sweep,
zoo, evaluation, report) and the readers (report, CLI) alike. A training run's folder is crossbert_model.run_layout's;
a results store's inside is crossbert_eval.results' (ResultsStore).

    <sweep>/                          SweepDir                   <zoo>/            ZooDir
        sweep.yaml  plan.json                                        zoo.yaml
        runs/<run>/                   RunDir (crossbert_model.run_layout)
        claims/  completed.jsonl  skipped.jsonl  encoder_reliance.jsonl  unigram_entropies.jsonl
      both (EvaluationFolder):
        results/  baselines/          ResultsStore folders; features/ and mteb/: the feature cache and mteb's cache
        checkpoints.jsonl             a row per evaluated model (checkpoint)
        timings.jsonl                 a row per stage
        tables/  plots/  report.md  report.html  summary.json
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from crossbert_model.run_layout import Folder, RunDir


@dataclass(frozen=True)
class EvaluationFolder(Folder):
    """What a sweep's and a zoo's folders share: the evaluated models, their scores and the report."""

    @property
    def results(self) -> Path:
        """The results store's folder (crossbert_eval.results.ResultsStore)."""
        return self.path / "results"

    @property
    def baselines(self) -> Path:
        """The baselines' results store (chance, majority, TF-IDF: crossbert_eval.baselines)."""
        return self.path / "baselines"

    @property
    def models(self) -> Path:
        """A row per evaluated model (checkpoint), written by crossbert_eval.evaluation.ModelRecords."""
        return self.path / "checkpoints.jsonl"

    @property
    def timings(self) -> Path:
        return self.path / "timings.jsonl"

    @property
    def tables(self) -> Path:
        return self.path / "tables"

    @property
    def plots(self) -> Path:
        return self.path / "plots"

    @property
    def report(self) -> Path:
        return self.path / "report.md"

    @property
    def report_html(self) -> Path:
        return self.path / "report.html"

    @property
    def summary(self) -> Path:
        """The report's verdict, machine-readable."""
        return self.path / "summary.json"

    @property
    def report_lock(self) -> Path:
        return self.path / ".report.lock"

    @property
    def features(self) -> Path:
        """The feature cache (a zoo may name a shared one instead: ZooConfig.features_dir)."""
        return self.path / "features"

    @property
    def mteb(self) -> Path:
        """mteb's own result cache."""
        return self.path / "mteb"

    def pages(self) -> tuple[Path, Path]:
        """The report's pages, which name its tables and plots (so they are replaced after them)."""
        return self.report, self.report_html


@dataclass(frozen=True)
class SweepDir(EvaluationFolder):
    """A sweep's folder: its config and plan, its training runs, and what its workers share."""

    @property
    def config(self) -> Path:
        return self.path / "sweep.yaml"

    @property
    def plan(self) -> Path:
        return self.path / "plan.json"

    @property
    def runs(self) -> Path:
        return self.path / "runs"

    def run(self, key: str) -> RunDir:
        return RunDir(self.runs / key)

    @property
    def claims(self) -> Path:
        return self.path / "claims"

    @property
    def submitit(self) -> Path:
        """Cluster jobs' scripts, pickles and logs (unless `submitit.folder` names another)."""
        return self.path / "submitit"

    @property
    def tokenizer(self) -> Path:
        """A committed sweep's pinned copy of the tokenizer its runs were trained with."""
        return self.path / "tokenizer"

    @property
    def claims_lock(self) -> Path:
        return self.path / ".claims.lock"

    @property
    def completed(self) -> Path:
        """A row per run trained and probed, with its signature."""
        return self.path / "completed.jsonl"

    @property
    def skipped(self) -> Path:
        """Runs skipped for the wall budget, with the prediction."""
        return self.path / "skipped.jsonl"

    @property
    def reliance(self) -> Path:
        """The encoder reliance of each run's final checkpoint (crossbert_model.reliance)."""
        return self.path / "encoder_reliance.jsonl"

    @property
    def unigram_entropies(self) -> Path:
        """Unigram entropies filled in for runs trained before the trainer recorded them."""
        return self.path / "unigram_entropies.jsonl"

    @property
    def report_stamp(self) -> Path:
        """What the last report was built from (a rebuild with nothing new is skipped)."""
        return self.path / ".report_inputs.json"


@dataclass(frozen=True)
class ZooDir(EvaluationFolder):
    """A zoo's folder: its resolved config (what makes a folder a zoo) and the shared evaluation files."""

    @property
    def config(self) -> Path:
        return self.path / "zoo.yaml"
