"""A learning-rate scan's table (results/lr_scan/README.md) from the runs' metrics.jsonl of one or more sweeps:
own-ratio shared-protocol loss along training and its margin below the unigram entropy.

    python experiments/lr_scan/make_table.py runs/sweeps/lr_scan > results/lr_scan/table.md
    python experiments/lr_scan/make_table.py runs/sweeps/lr_scan_second_target runs/sweeps/lr_scan_second_target_seeds \\
        > results/lr_scan_second_target/table.md
"""

import json
import sys
from pathlib import Path

from crossbert_model.plateau import PLATEAU_MARGIN
from crossbert_model.shared_loss import protocol_key


def rows(sweep: Path):
    entropies = {}
    runs = {}
    for metrics in sorted(sweep.glob("runs/*/metrics.jsonl")):
        evals = [r for r in map(json.loads, metrics.read_text().splitlines()) if "shared_loss_r15" in r and r["step"] > 0]
        runs[metrics.parent.name] = evals
        for r in evals:  # every run of the sweep reads one tokenizer and one validation set: one entropy per ratio
            entropies.update({k: v for k, v in r.items() if k.startswith("unigram_entropy_r")})
    for name, evals in runs.items():
        ratio = 0.15 if name.startswith("mlm") else 0.5
        entropy = entropies[protocol_key("unigram_entropy", ratio)]
        losses = {r["step"]: r[protocol_key("shared_loss", ratio)] for r in evals}
        yield name, ratio, entropy, losses


def main(sweeps: list[str]) -> None:
    steps = [150, 300, 450, 600]
    print(
        "| run | own ratio | unigram entropy | "
        + " | ".join(f"loss at {s * 4096 / 1e6:.2f}M tokens" for s in steps)
        + f" | final margin | off the plateau (>= {PLATEAU_MARGIN}) |"
    )
    print("|---" * (len(steps) + 5) + "|")
    for name, ratio, entropy, losses in (row for sweep in sweeps for row in rows(Path(sweep))):
        if not losses:  # still training, before its first evaluation
            continue
        last = losses[max(losses)]
        cells = [f"{losses[s]:.3f}" if s in losses else "-" for s in steps]
        print(
            f"| {name} | {ratio} | {entropy:.3f} | "
            + " | ".join(cells)
            + f" | {entropy - last:.2f} (step {max(losses)}) | {'yes' if entropy - last >= PLATEAU_MARGIN else 'no'} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
