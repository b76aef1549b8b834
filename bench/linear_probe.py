"""Linear probe cost per task, split into encoding, regularisation search and final fit, cold and warm.

    python bench/linear_probe.py [--tasks SST-2,CoLA,MRPC,STS-B] [--model minilm]

Cold: an empty feature cache (everything encoded). Warm: the same probes again with the cache
filled, as a re-probe under another protocol setting runs (units forced, not skipped).
"""

from __future__ import annotations

import argparse
import tempfile
import time

from _common import markdown, setup, write


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="SST-2,CoLA,MRPC,STS-B")
    p.add_argument("--model", default="minilm")
    p.add_argument("--out", default="runs/bench")
    args = p.parse_args()
    setup()
    from crossbert_eval.encoders import FrozenEncoder
    from crossbert_eval.probe_runner import ProbeRunner, ProbeSettings
    from crossbert_eval.tasks import resolve_tasks

    encoder = FrozenEncoder.load(args.model, batch_size=128)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in resolve_tasks(args.tasks):
            for phase in ("cold", "warm"):
                settings = ProbeSettings(
                    tasks=[task.name], probes=["linear"], results_dir=f"{tmp}/results", cache_dir=f"{tmp}/features", force=True
                )
                runner = ProbeRunner(encoder, settings)
                start = time.perf_counter()
                df = runner.run([task])
                total = time.perf_counter() - start
                main_rows = df[df["is_main"]]
                search = sum(p["search_seconds"] for p in main_rows["protocol"])
                final = sum(p["final_fit_seconds"] for p in main_rows["protocol"])
                rows.append(
                    {
                        "task": task.name,
                        "phase": phase,
                        "n_train": int(main_rows["n_train"].iloc[0]),
                        "total_s": total,
                        "encode_s": total - main_rows["probe_seconds"].sum(),
                        "C_search_s": search,
                        "final_fit_s": final,
                        "encoded_sets": runner.cache.misses,
                    }
                )
    table = markdown(rows, ["task", "phase", "n_train", "total_s", "encode_s", "C_search_s", "final_fit_s", "encoded_sets"])
    write(args.out, "linear_probe", rows, table, model=args.model)


if __name__ == "__main__":
    main()
