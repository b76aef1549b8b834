"""Feature extraction: all-MiniLM-L6-v2 through our FrozenEncoder vs SentenceTransformer.encode.

    python bench/feature_extraction.py [--n 8000] [--rounds 3]

Same texts (SST-2 train, first N), same batch size, same device, interleaved rounds. Also checks that
the outputs agree (our mean pooling, L2-normalised, vs sentence-transformers' normalised embedding)
and measures the cost of extracting every layer (7 hidden states) instead of the last only.
"""

from __future__ import annotations

import argparse

import numpy as np
from _common import interleaved, markdown, median_ratio, setup, write


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=8000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="runs/bench")
    args = p.parse_args()
    setup()
    from sentence_transformers import SentenceTransformer

    from crossbert_eval.encoders import FrozenEncoder
    from crossbert_eval.tasks import get_task
    from crossbert_model.data.tokenizer import minilm_path
    from crossbert_model.defaults import MAX_LENGTH

    texts = get_task("SST-2").load_split("train").texts[: args.n]
    ours = FrozenEncoder.load("minilm", batch_size=args.batch_size, max_length=MAX_LENGTH)
    st = SentenceTransformer(str(minilm_path()), device="cpu")
    st.max_seq_length = MAX_LENGTH  # the same truncation as ours
    out = {}

    def ours_last():
        out["ours"] = ours.encode(texts, layers=[6], poolings=["mean"])[(6, "mean")]

    def ours_all():
        ours.encode(texts, layers=list(range(7)), poolings=["mean"])

    def sentence_transformers():
        out["st"] = st.encode(texts, batch_size=args.batch_size, show_progress_bar=False)

    times = interleaved(
        {"sentence_transformers": sentence_transformers, "ours_last_layer": ours_last, "ours_all_layers": ours_all}, args.rounds
    )
    ours_norm = out["ours"] / np.linalg.norm(out["ours"], axis=1, keepdims=True)
    max_diff = float(np.abs(ours_norm - out["st"]).max())
    rows = []
    for name, ts in times.items():
        rows.append(
            {
                "contender": name,
                "sentences_per_s": args.n / float(np.median(ts)),
                "x_vs_sentence_transformers": median_ratio(times, "sentence_transformers", name),
            }
        )
    all_vs_last = median_ratio(times, "ours_last_layer", "ours_all_layers")
    table = markdown(rows, ["contender", "sentences_per_s", "x_vs_sentence_transformers"])
    table += f"\n\nmax |ours - sentence-transformers| (normalised embeddings): {max_diff:.2e}; all layers cost {1 / all_vs_last:.2f}x the last layer alone"
    write(
        args.out,
        "feature_extraction",
        rows,
        table,
        max_abs_diff=max_diff,
        all_layers_cost=1 / all_vs_last,
        n=args.n,
        rounds=args.rounds,
    )


if __name__ == "__main__":
    main()
