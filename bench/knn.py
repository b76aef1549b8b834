"""kNN probe search: FAISS IndexFlatIP vs scikit-learn brute force on the same features.

    python bench/knn.py [--n-base 50000] [--n-query 10000] [--k 20]

Features: all-MiniLM-L6-v2, last layer, mean pooling, SST-2 train sentences (from the feature
cache when present). Both return the k nearest by cosine; the neighbour sets are compared.
"""

from __future__ import annotations

import argparse

import numpy as np
from _common import interleaved, markdown, median_ratio, setup, write


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-base", type=int, default=50000)
    p.add_argument("--n-query", type=int, default=10000)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cache", default="runs/features")
    p.add_argument("--out", default="runs/bench")
    args = p.parse_args()
    setup()
    from sklearn.neighbors import NearestNeighbors

    from crossbert_eval.encoders import FeatureCache, FrozenEncoder
    from crossbert_eval.probes import knn_search
    from crossbert_eval.tasks import get_task

    texts = get_task("SST-2").load_split("train").texts
    encoder = FrozenEncoder.load("minilm", batch_size=128)
    x = FeatureCache(args.cache).features(encoder, texts, None, [6], ["mean"], "SST-2/train/text")[(6, "mean")]
    base, query = x[: args.n_base], x[args.n_base : args.n_base + args.n_query]
    out = {}

    def faiss_flat_ip():
        out["faiss"] = knn_search(base, query, args.k)[1]

    def sklearn_brute_cosine():
        nn = NearestNeighbors(n_neighbors=args.k, algorithm="brute", metric="cosine").fit(base)
        out["sklearn"] = nn.kneighbors(query, return_distance=False)

    times = interleaved({"sklearn_brute_cosine": sklearn_brute_cosine, "faiss_flat_ip": faiss_flat_ip}, args.rounds)
    same = float(np.mean([len(set(a) & set(b)) / args.k for a, b in zip(out["faiss"], out["sklearn"])]))
    rows = [
        {"contender": n, "seconds": float(np.median(t)), "queries_per_s": len(query) / float(np.median(t)),
         "x_vs_sklearn": median_ratio(times, "sklearn_brute_cosine", n)}
        for n, t in times.items()
    ]  # fmt: skip
    table = markdown(rows, ["contender", "seconds", "queries_per_s", "x_vs_sklearn"])
    table += f"\n\nbase {len(base):,} x {base.shape[1]}, {len(query):,} queries, k={args.k}; neighbour-set overlap {same:.4f}"
    write(args.out, "knn", rows, table, neighbour_overlap=same, n_base=len(base), n_query=len(query), k=args.k)


if __name__ == "__main__":
    main()
