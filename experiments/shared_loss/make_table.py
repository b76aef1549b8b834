"""Collect the shared-loss runs (runs/shared_loss/<row>_s<seed>) into table.csv and a markdown table.

.venv/bin/python experiments/shared_loss/make_table.py

Native validation loss and the shared-protocol losses at step 300 come from metrics.jsonl (recorded by
Trainer.evaluate); a run trained before the protocol existed is scored from its final checkpoint
with crossbert_model.shared_loss.shared_losses_for_checkpoint (same sequences, same masks).
"""

import csv
import json
import statistics
import sys
from pathlib import Path

from crossbert_model.checkpoint import list_checkpoints
from crossbert_model.shared_loss import SHARED_LOSS_R15, SHARED_LOSS_R50, shared_losses_for_checkpoint

RUNS = Path("runs/shared_loss")
OUT = Path(__file__).resolve().parents[2] / "results" / "shared_loss"  # the study's results folder
ROWS = [  # (run name prefix, description)
    ("mlm15_bert", "flat MLM 15%, BERT 80/10/10"),
    ("mlm50_bert", "flat MLM 50%, BERT 80/10/10"),
    ("mlm50_pure", "flat MLM 50%, every selected token -> [MASK]"),
    ("cb50_cms", "CrossBERT 50%, CMS"),
    ("cb50_nocms", "CrossBERT 50%, no CMS"),
]
KEYS = ("val_loss", SHARED_LOSS_R15, SHARED_LOSS_R50)
ENTROPY_R50 = "unigram_entropy_r50"  # the plateau of the r = 0.5 targets (crossbert_model/plateau.py)


def final_metrics(run_dir: Path) -> dict | None:
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        return None  # not finished
    step, path = checkpoints[-1]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if r.get("step") == step and "val_loss" in r][-1]
    source = "trainer"
    if SHARED_LOSS_R50 not in last:
        last = {**last, **shared_losses_for_checkpoint(path)}
        source = "checkpoint"
    entropy = next((r[ENTROPY_R50] for r in rows if ENTROPY_R50 in r), float("nan"))  # recorded with the first evaluation
    return {"step": step, "source": source, **{k: last[k] for k in KEYS}, "margin_r50": entropy - last[SHARED_LOSS_R50]}


def main() -> None:
    table = []
    for prefix, description in ROWS:
        for run_dir in sorted(RUNS.glob(f"{prefix}_s*")):
            metrics = final_metrics(run_dir)
            if metrics is None:
                print(f"{run_dir}: not finished, left out", file=sys.stderr)
                continue
            seed = int(run_dir.name.rsplit("_s", 1)[1])
            table.append({"row": prefix, "objective": description, "seed": seed, **metrics})
    with open(OUT / "table.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["row", "objective", "seed", "step", *KEYS, "margin_r50", "source"])
        writer.writeheader()
        writer.writerows(table)
    columns = (*KEYS, "margin_r50")
    print("| objective | seed | native val loss | shared loss r=0.15 | shared loss r=0.5 | below the unigram entropy at r=0.5 |")
    print("|---|---|---|---|---|---|")
    for prefix, description in ROWS:
        runs = [r for r in table if r["row"] == prefix]
        for r in runs:
            print(f"| {description} | {r['seed']} | " + " | ".join(f"{r[k]:.3f}" for k in columns) + " |")
        if len(runs) > 1:
            means = [statistics.mean(r[k] for r in runs) for k in columns]
            spreads = [max(r[k] for r in runs) - min(r[k] for r in runs) for k in columns]
            print(f"| {description} | mean (range) | " + " | ".join(f"{m:.3f} ({s:.3f})" for m, s in zip(means, spreads)) + " |")


if __name__ == "__main__":
    main()
