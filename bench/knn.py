"""kNN probe search: FAISS IndexFlatIP vs scikit-learn brute force on the same features.

    python bench/knn.py [--n-base 50000] [--n-query 10000] [--k 20]

Features: all-MiniLM-L6-v2, last layer, mean pooling (from the feature cache when present). Two
workloads: the probe's own (SST-2: every train sentence is the base, the dev set the queries) and a
large one (the first N train sentences as base, the next M as queries), where both libraries are
bound by the same matrix product. Both return the k nearest by cosine; the neighbour sets are compared.
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
    from crossbert_eval.encoders import FrozenEncoder
    from crossbert_eval.feature_cache import FeatureCache
    from crossbert_eval.tasks import get_task

    task = get_task("SST-2")
    encoder = FrozenEncoder.load("minilm", batch_size=128)
    cache = FeatureCache(args.cache)

    def features(split: str):
        return cache.features(encoder, task.load_split(split).texts, None, [6], ["mean"], f"SST-2/{split}/text")[(6, "mean")]

    train = features("train")
    workloads = {
        "SST-2 probe (train -> dev)": (train, features("validation")),
        "large (train[:N] -> train[N:N+M])": (train[: args.n_base], train[args.n_base : args.n_base + args.n_query]),
    }
    rows, tables, overlaps = [], [], {}
    for workload, (base, query) in workloads.items():
        workload_rows, overlap = compare(base, query, args.k, args.rounds)
        for r in workload_rows:
            r.update(workload=workload, n_base=len(base), n_query=len(query))
        rows += workload_rows
        overlaps[workload] = overlap
        tables.append(
            f"{workload}: base {len(base):,} x {base.shape[1]}, {len(query):,} queries, k={args.k}; neighbour-set overlap {overlap:.4f}"
        )
    table = markdown(rows, ["workload", "contender", "seconds", "queries_per_s", "x_vs_sklearn"]) + "\n\n" + "\n".join(tables)
    write(args.out, "knn", rows, table, neighbour_overlap=overlaps, k=args.k)


def compare(base: np.ndarray, query: np.ndarray, k: int, rounds: int) -> tuple[list[dict], float]:
    """Both searches on one workload, interleaved; per-contender rows and the neighbour-set overlap."""
    from sklearn.neighbors import NearestNeighbors

    from crossbert_eval.probes import knn_search

    out = {}

    def faiss_flat_ip():
        out["faiss"] = knn_search(base, query, k)[1]

    def sklearn_brute_cosine():
        nn = NearestNeighbors(n_neighbors=k, algorithm="brute", metric="cosine").fit(base)
        out["sklearn"] = nn.kneighbors(query, return_distance=False)

    times = interleaved({"sklearn_brute_cosine": sklearn_brute_cosine, "faiss_flat_ip": faiss_flat_ip}, rounds)
    overlap = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(out["faiss"], out["sklearn"])]))
    rows = [
        {
            "contender": n,
            "seconds": float(np.median(t)),
            "queries_per_s": len(query) / float(np.median(t)),
            "x_vs_sklearn": median_ratio(times, "sklearn_brute_cosine", n),
        }
        for n, t in times.items()
    ]
    return rows, overlap


if __name__ == "__main__":
    main()
