"""The sweep's slowest stage, mteb classification, with and without materialised labels.

    python bench/mteb_stage.py [--model minilm] [--rounds 3]

Profiling a sweep (cProfile) showed 60% of a Banking77Classification evaluation inside sklearn
converting mteb's lazy `datasets` Column of test labels row by row, once per metric. Our local tasks
materialise that column once (`crossbert_eval.mteb_tasks.column_array`). This runs mteb's own
evaluation of the same task and the same cached embeddings both ways, interleaved, and checks that the
scores are identical.
"""

from __future__ import annotations

import argparse
import tempfile

from _common import interleaved, markdown, median_ratio, setup, write


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="minilm")
    p.add_argument("--task", default="Banking77Classification")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cache", default="runs/features")
    p.add_argument("--out", default="runs/bench")
    args = p.parse_args()
    setup()
    import mteb

    from crossbert_eval.encoders import FrozenEncoder
    from crossbert_eval.feature_cache import FeatureCache
    from crossbert_eval.mteb_encoder import make_mteb_encoder
    from crossbert_eval.mteb_tasks import local_mteb_task
    from crossbert_eval.tasks import get_task

    encoder = FrozenEncoder.load(args.model)
    model = make_mteb_encoder(encoder, encoder.num_layers, "mean", FeatureCache(args.cache))
    scores = {}

    def evaluate(materialise: bool):
        task = local_mteb_task(get_task(args.task), materialise_labels=materialise)
        with tempfile.TemporaryDirectory() as tmp:
            result = mteb.evaluate(
                model,
                [task],
                cache=mteb.ResultCache(cache_path=tmp),
                overwrite_strategy="always",
                co2_tracker=False,
                show_progress_bar=False,
            )
        scores[materialise] = result.task_results[0].scores["test"][0]["main_score"]

    evaluate(True)  # warm the feature cache so both variants time evaluation only
    times = interleaved(
        {"mteb_column_labels": lambda: evaluate(False), "materialised_labels": lambda: evaluate(True)}, args.rounds
    )
    rows = [
        {"variant": n, "seconds": sorted(t)[len(t) // 2], "x_vs_mteb_column_labels": median_ratio(times, "mteb_column_labels", n)}
        for n, t in times.items()
    ]
    table = markdown(rows, ["variant", "seconds", "x_vs_mteb_column_labels"])
    table += f"\n\n{args.task} main score: {scores[False]:.6f} (mteb's labels) vs {scores[True]:.6f} (materialised)"
    assert scores[False] == scores[True]
    write(args.out, "mteb_stage", rows, table, task=args.task, scores={str(k): v for k, v in scores.items()})


if __name__ == "__main__":
    main()
