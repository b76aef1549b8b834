"""One report folder from two sweep folders of the same settings (issue 20's second target).

The flat MLM and light-default CrossBERT runs were made by configs/sweep/cpu_offplateau.yaml, the CrossBERT runs
with the one-layer 64-wide predictor by configs/sweep/cpu_offplateau_predictor.yaml (same corpus, tokenizer,
budget, schedule, probes). This copies both folders' stored rows (scores, their predictions, checkpoints,
timings) into one folder whose sweep.yaml lists every objective, flat MLM first (the comparisons' reference),
and rebuilds its report there:

    python results/cpu_offplateau/assemble.py runs/sweeps/cpu_offplateau runs/sweeps/cpu_offplateau_predictor OUT [RUN ...]
    crossbert report OUT        # then `make reference`'s copy, from OUT

RUN names a run to leave out (its checkpoints and scores), for a report on a subset of the runs: e.g. only
those off the unigram plateau, a selection on the outcome that the folder's README must state.
A unit (task, probe, layer, ... of one model) found in both folders is refused: the folders must not overlap.
"""

import json
import shutil
import sys
from pathlib import Path

from crossbert_model.args import dump_yaml, read_yaml
from crossbert_model.utils import atomic_write_json, atomic_write_text, read_jsonl

ROW_FILES = ("checkpoints.jsonl", "timings.jsonl", "results/results.jsonl")


def kept(row: dict, left_out: set[str]) -> bool:
    """A row of no left-out run: checkpoint and timing rows name their run, score rows their model (run@step)."""
    return row.get("run", row.get("model", "")).split("@")[0] not in left_out


def refuse(message: str) -> None:
    print(f"assemble: {message}", file=sys.stderr)
    sys.exit(2)


def assemble(first: Path, second: Path, out: Path, left_out: set[str] = frozenset()) -> None:
    if out.exists():
        refuse(f"{out} exists; expected a new folder")
    for folder in (first, second):
        missing = [name for name in (*ROW_FILES, "sweep.yaml", "plan.json") if not (folder / name).is_file()]
        if missing:
            refuse(f"{folder} lacks {', '.join(missing)}; expected a sweep folder")
    runs = {row["run"] for folder in (first, second) for row in read_jsonl(folder / "checkpoints.jsonl")}
    if left_out - runs:
        refuse(f"no run named {', '.join(sorted(left_out - runs))} to leave out; runs: {', '.join(sorted(runs))}")
    first_units, second_units = ({row["unit"] for row in read_jsonl(folder / "results" / "results.jsonl")} for folder in (first, second))
    if first_units & second_units:
        refuse(f"{first} and {second} share {len(first_units & second_units)} result units; expected disjoint sweeps")
    (out / "results" / "predictions").mkdir(parents=True)
    for name in ROW_FILES:
        rows = [row for folder in (first, second) for row in read_jsonl(folder / name) if kept(row, left_out)]
        atomic_write_text(out / name, "".join(json.dumps(row) + "\n" for row in rows))
    units = {row["unit"] for row in read_jsonl(out / "results" / "results.jsonl")}
    for folder in (first, second):
        for prediction in (folder / "results" / "predictions").iterdir():
            if prediction.stem in units:  # a prediction file is named by its unit
                shutil.copy2(prediction, out / "results" / "predictions" / prediction.name)
    sweep = read_yaml(first / "sweep.yaml")
    sweep["objectives"] = sweep["objectives"] + read_yaml(second / "sweep.yaml")["objectives"]
    atomic_write_text(out / "sweep.yaml", dump_yaml(sweep))
    plans = [json.loads((folder / "plan.json").read_text()) for folder in (first, second)]
    atomic_write_json(out / "plan.json", {**plans[0], "runs": [r for plan in plans for r in plan["runs"] if kept(r, left_out)], "assembled_from": [first.name, second.name]})


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    assemble(*map(Path, sys.argv[1:4]), set(sys.argv[4:]))
