"""The escape scan's table (results/escape_scan/README.md): each run's shared-protocol loss at its own
training ratio after the budget, its margin below the unigram entropy of the same targets, and the r = 0.5 loss
every run is also asked.

    python experiments/escape_scan/make_table.py runs/sweeps/escape_scan > results/escape_scan/table.md
"""

import json
import sys
from pathlib import Path

import yaml

from crossbert_model.plateau import PLATEAU_MARGIN
from crossbert_model.shared_loss import SHARED_LOSS_R50, protocol_key


def row(run: Path) -> str:
    config = yaml.safe_load((run / "config.yaml").read_text())
    model, optim = config["model"], config["optim"]
    ratio = model["mask_ratio"]
    evals = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if SHARED_LOSS_R50 in r]
    first, last = evals[0], evals[-1]
    loss, entropy = last[protocol_key("shared_loss", ratio)], first[protocol_key("unigram_entropy", ratio)]
    shape = (model.get("predictor_hidden_size") or "default", model.get("predictor_heads") or "default")
    predictor = "width {}, heads {}".format(*shape) if model["objective"] == "crossbert" else "-"
    margin = entropy - loss
    return (
        f"| {run.name} | {model['objective']} | {ratio} | {config['batch_size']} | {optim['lr']:g} | {predictor} | "
        f"{last['corpus_tokens'] / 1e6:.2f}M | {loss:.3f} | {entropy:.3f} | {margin:.2f} | "
        f"{'yes' if margin >= PLATEAU_MARGIN else 'no'} | {last[SHARED_LOSS_R50]:.3f} |"
    )


def main(sweep: str) -> None:
    print(
        "| run | objective | training ratio | batch | lr | predictor | corpus tokens | own-ratio shared loss "
        "| unigram entropy | margin | off the plateau | shared loss r=0.5 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for run in sorted(Path(sweep).glob("runs/*/")):
        print(row(run))


if __name__ == "__main__":
    main(sys.argv[1])
