"""Which mteb tasks run: task names and benchmarks resolved to mteb task objects on the local data.

* `--benchmark local-eng`: every task file with an `mteb:` section.
* `--benchmark NAME` with any benchmark mteb defines runs each of its tasks that a task file stands for
  (by name, or as a marked variant) with the benchmark's splits and subsets, and reports the others as
  skipped with where their data was looked for (BenchmarkPlan); tables state the coverage.
* Any other name mteb knows runs from the hub when CROSSBERT_ONLINE=1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from crossbert_model.utils import online

from .mteb_tasks import DATA_STATUS, MtebError, data_status, local_mteb_task
from .tasks import Task, TaskDataMissing, all_tasks, tasks_dir

# Our own benchmark; any other name is looked up among mteb's benchmarks (mteb.get_benchmark).
BENCHMARKS = {"local-eng": "every task file with an `mteb:` section"}
# A task name ending in a version (STS22.v2, Touche2020Retrieval.v3): mteb's revised edition of a task.
_VERSIONED = re.compile(r"\.v\d+$")


@dataclass
class BenchmarkPlan:
    """What of an mteb benchmark runs here. `ran`: benchmark task -> the task file that stands for it
    (itself, or a marked variant); `skipped`: benchmark task -> why, naming where its data was looked for;
    `versions`: benchmark task with a version suffix (.v2, .v3) -> whether the local data reproduces it."""

    name: str
    size: int
    ran: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)

    def coverage_line(self) -> str:
        tasks = {t.name: t for t in all_tasks().values()}
        kinds = [data_status(tasks.get(local)) for local in self.ran.values()]
        counts = ", ".join(f"{kinds.count(k)} {DATA_STATUS[k]}" for k in DATA_STATUS if kinds.count(k))
        return (
            f"coverage: {len(self.ran)} of {self.size} {self.name} tasks ran on local data ({counts or 'none'}); "
            f"{len(self.skipped)} skipped"
        )

    def report(self) -> str:
        """The coverage line, the skipped tasks with where each was looked for, and the .vN notes."""
        lines = [self.coverage_line(), "", f"skipped ({len(self.skipped)}):"]
        lines += [f"  {name}: {why}" for name, why in self.skipped.items()]
        if self.versions:
            lines += ["", f"versioned tasks of {self.name} (.v2/.v3) and the local data:"]
            lines += [f"  {name}: {note}" for name, note in self.versions.items()]
        return "\n".join(lines)


def _hub_source(mteb_task) -> str:
    dataset = mteb_task.metadata.dataset
    revision = dataset.get("revision") or ""
    return f"{dataset.get('path')}@{revision[:8]}" if revision else str(dataset.get("path"))


def _standing_for(local: dict[str, Task]) -> dict[str, Task]:
    """mteb task name -> the task file that stands for it: a file of that name, else a marked variant."""
    out = {t.mteb.variant_of: t for t in local.values() if t.mteb.variant_of}
    out.update({name: t for name, t in local.items() if not t.mteb.variant_of})
    return out


def _get_benchmark(name: str):
    import mteb

    try:
        return mteb.get_benchmark(name)
    except (KeyError, ValueError):
        known = [b.name for b in mteb.get_benchmarks() if "eng" in b.name.lower()]
        raise MtebError(
            f"unknown benchmark {name!r}: neither ours ({', '.join(BENCHMARKS)}) nor mteb's (English ones: {', '.join(known)})"
        ) from None


def plan_benchmark(name: str, root=None) -> tuple[list, BenchmarkPlan]:
    """mteb's own definition of benchmark `name`: every task a task file stands for, restricted to the
    benchmark's splits and subsets, with its data read now (a task whose files are missing is skipped,
    naming them); the others are skipped, or fetched from the hub when CROSSBERT_ONLINE=1."""
    bench = _get_benchmark(name)
    standing = _standing_for({t.name: t for t in all_tasks().values() if t.mteb})
    plan = BenchmarkPlan(bench.name, len(bench.tasks))
    objects = []
    for hub_task in bench.tasks:
        mteb_name = hub_task.metadata.name
        task = standing.get(mteb_name)
        why = None
        if task is None:
            why = (
                f"no task file in {tasks_dir()} declares it (as its name or mteb.variant_of); mteb's data: "
                f"{_hub_source(hub_task)} on the Hugging Face hub"
            )
        else:
            local = local_mteb_task(task, root)
            splits = [s for s in hub_task.eval_splits if s in local.eval_splits]
            subsets = [s for s in hub_task.hf_subsets if s in local.hf_subsets]
            if not splits or not subsets:
                why = (
                    f"{task.source_file} has splits {local.eval_splits} / subsets {local.hf_subsets}; the benchmark "
                    f"asks for {hub_task.eval_splits} / {hub_task.hf_subsets}"
                )
            else:
                local.filter_eval_splits(splits).hf_subsets = subsets
                try:
                    local.load_data()
                except TaskDataMissing as e:
                    why = str(e)
        if why is None:
            plan.ran[mteb_name] = task.name
            objects.append(local)
        elif online():
            plan.ran[mteb_name] = mteb_name
            objects.append(hub_task)
        else:
            plan.skipped[mteb_name] = why
        if _VERSIONED.search(mteb_name):
            plan.versions[mteb_name] = _version_note(mteb_name, task, mteb_name in plan.ran)
    return objects, plan


def _version_note(mteb_name: str, task: Task | None, ran: bool) -> str:
    if not ran:
        return "not reproduced: no local data"
    if task is not None and task.mteb.variant_of:
        return f"not reproduced by the local data ({task.mteb.data_differs}); ran as the marked variant {task.name}"
    if task is not None and data_status(task) == "differs":
        return f"ran, with a named data difference: {task.mteb.data_differs}"
    return "reproduced: the local data is MTEB's"


def resolve_mteb_tasks(names: list[str], benchmark: str | None, root=None) -> tuple[list, BenchmarkPlan | None]:
    """The mteb task objects for `names` (and `benchmark`); for an mteb benchmark also its plan."""
    import mteb

    local = {t.name: t for t in all_tasks().values() if t.mteb}
    out, plan = [], None
    if benchmark in BENCHMARKS:
        names = list(names) + sorted(local)
    elif benchmark:
        out, plan = plan_benchmark(benchmark, root)
    taken = {t.metadata.name for t in out}
    variants = {t.mteb.variant_of: t.name for t in local.values() if t.mteb.variant_of}
    for name in dict.fromkeys(n for n in names if n not in taken):
        if name in local:
            out.append(local_mteb_task(local[name], root))
            continue
        try:
            hub_task = mteb.get_task(name)
        except (KeyError, ValueError):
            raise MtebError(
                f"mteb has no task named {name!r}, and no task file in tasks/ declares it (local: {', '.join(sorted(local))})"
            ) from None
        if not online():
            variant = f"; the local variant {variants[name]} stands for it (not MTEB's exact data)" if name in variants else ""
            raise TaskDataMissing(
                f"task {name} is an mteb task without local data in the data root{variant}; set CROSSBERT_ONLINE=1 to let "
                f"mteb fetch {hub_task.metadata.dataset.get('path')} from the hub"
            )
        out.append(hub_task)
    return out, plan


def check_local_data(tasks: list, root=None) -> None:
    """Load every task's data before any model runs, so a missing file stops the run with nothing written."""
    for t in tasks:
        if hasattr(t, "load_data") and type(t).__name__.startswith("Local"):
            t.load_data()
