"""One report folder from sweep folders of the same settings (the second target).

The flat MLM and light-default CrossBERT runs were made by configs/sweep/cpu_offplateau.yaml, the CrossBERT runs
with the one-layer 64-wide predictor by configs/sweep/cpu_offplateau_predictor.yaml, those with token embeddings
drawn at std 1.0 by configs/sweep/cpu_offplateau_embedding.yaml (same corpus, tokenizer, budget, schedule,
probes). This copies the folders' stored rows (scores, their predictions, checkpoints, timings) into one folder
whose sweep.yaml lists every objective, the first folder's first (its first objective, flat MLM, is the
comparisons' reference), and rebuilds its report there:

    python experiments/cpu_offplateau/assemble.py OUT runs/sweeps/cpu_offplateau runs/sweeps/cpu_offplateau_predictor \
        runs/sweeps/cpu_offplateau_embedding [--leave-out RUN ...]
    crossbert report OUT        # then `make reference`'s copy, from OUT

RUN names a run to leave out (its checkpoints and scores), for a report on a subset of the runs: e.g. only
those off the unigram plateau, a selection on the outcome that the folder's README must state.
A unit (task, probe, layer, ... of one model) found in two folders is refused: the folders must not overlap.
"""

import json
import shutil
import sys
from pathlib import Path

from crossbert_model.args import dump_yaml, read_yaml
from crossbert_model.utils import atomic_write_json, atomic_write_text
from crossbert_model.readers import read_jsonl

ROW_FILES = ("checkpoints.jsonl", "timings.jsonl", "results/results.jsonl")


def kept(row: dict, left_out: set[str]) -> bool:
    """A row of no left-out run: checkpoint and timing rows name their run, score rows their model (run@step)."""
    return row.get("run", row.get("model", "")).split("@")[0] not in left_out


def refuse(message: str) -> None:
    print(f"assemble: {message}", file=sys.stderr)
    sys.exit(2)


def assemble(folders: list[Path], out: Path, left_out: set[str] = frozenset()) -> None:
    if out.exists():
        refuse(f"{out} exists; expected a new folder")
    if len(folders) < 2:
        refuse("expected at least two sweep folders after OUT")
    for folder in folders:
        missing = [name for name in (*ROW_FILES, "sweep.yaml", "plan.json") if not (folder / name).is_file()]
        if missing:
            refuse(f"{folder} lacks {', '.join(missing)}; expected a sweep folder")
    runs = {row["run"] for folder in folders for row in read_jsonl(folder / "checkpoints.jsonl")}
    if left_out - runs:
        refuse(f"no run named {', '.join(sorted(left_out - runs))} to leave out; runs: {', '.join(sorted(runs))}")
    seen: dict[str, Path] = {}
    for folder in folders:
        for unit in {row["unit"] for row in read_jsonl(folder / "results" / "results.jsonl")}:
            if unit in seen:
                refuse(f"{seen[unit]} and {folder} share result units (e.g. {unit}); expected disjoint sweeps")
            seen[unit] = folder
    (out / "results" / "predictions").mkdir(parents=True)
    for name in ROW_FILES:
        rows = [row for folder in folders for row in read_jsonl(folder / name) if kept(row, left_out)]
        atomic_write_text(out / name, "".join(json.dumps(row) + "\n" for row in rows))
    units = {row["unit"] for row in read_jsonl(out / "results" / "results.jsonl")}
    for folder in folders:
        for prediction in (folder / "results" / "predictions").iterdir():
            if prediction.stem in units:  # a prediction file is named by its unit
                shutil.copy2(prediction, out / "results" / "predictions" / prediction.name)
    sweep = read_yaml(folders[0] / "sweep.yaml")
    sweep["objectives"] = [o for folder in folders for o in read_yaml(folder / "sweep.yaml")["objectives"]]
    atomic_write_text(out / "sweep.yaml", dump_yaml(sweep))
    plans = [json.loads((folder / "plan.json").read_text()) for folder in folders]
    runs_kept = [r for plan in plans for r in plan["runs"] if kept(r, left_out)]
    atomic_write_json(out / "plan.json", {**plans[0], "runs": runs_kept, "assembled_from": [f.name for f in folders]})


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[0].startswith("-"):
        sys.exit(__doc__)
    split = argv.index("--leave-out") if "--leave-out" in argv else len(argv)
    assemble([Path(a) for a in argv[1:split]], Path(argv[0]), set(argv[split + 1 :]))


if __name__ == "__main__":
    main(sys.argv[1:])
