"""CPU float32 softmax with and without the exp pass's prefetch of the next row, with onnxruntime, interleaved in one
process (``benchmarks.softmax``'s CPU timing: best of 60 calls each), ``--runs`` times over row sizes from 4 KB to
200 KB: where the prefetch pays on this CPU (``schedules.softmax._PREFETCH_ROW_BYTES``).

    python benchmarks/results/rerun/softmax-cpu-prefetch/prefetch.py [--runs 3] [--out run1.json] [--shapes 8192x128,...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
SHAPES = [(1024, 1024), (512, 2048), (256, 4096), (128, 16384), (32, 32768), (64, 50257)]  # 4 KB .. 200 KB rows


def main() -> None:
    import tvm

    from benchmarks.softmax import _cpu_bench_interleaved, cpu_kernel, ort_softmax
    from compiler import targets
    from schedules import softmax_tir
    from schedules.softmax import cpu_lanes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("run1.json"))
    ap.add_argument("--shapes", help="rows x cols to time instead of SHAPES, e.g. 8192x128,16384x60")
    args = ap.parse_args()
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    info = targets.resolve("cpu")

    def build(rows: int, cols: int, prefetch: bool):
        func = softmax_tir.cpu(rows, cols, "float32", "softmax", cpu_lanes(info.target), prefetch)
        return cpu_kernel(func, "softmax", info.target)

    rng, records = np.random.default_rng(0), []
    for run in range(args.runs):
        for rows, cols in shapes:
            xt = tvm.runtime.tensor((rng.standard_normal((rows, cols)) * 4).astype("float32"))
            yt = tvm.runtime.empty((rows, cols), "float32")
            on, off = build(rows, cols, True), build(rows, cols, False)
            fns = {"onnxruntime": ort_softmax(np.from_dlpack(xt), np.from_dlpack(yt), info.cores),
                   "prefetch": lambda: on(xt, yt),
                   "no-prefetch": lambda: off(xt, yt)}
            best = _cpu_bench_interleaved(fns, dict.fromkeys(fns, 60))
            rec = {"run": run, "rows": rows, "cols": cols, "row_kb": cols * 4 / 1024,
                   **{f"{k}_ms": v for k, v in best.items()},
                   "no_prefetch_speedup": best["prefetch"] / best["no-prefetch"],
                   "prefetch_vs_onnxruntime": best["onnxruntime"] / best["prefetch"],
                   "no_prefetch_vs_onnxruntime": best["onnxruntime"] / best["no-prefetch"],
                   "cpu": info.isa_summary(), "threads": info.cores}
            print(json.dumps(rec), flush=True)
            records.append(rec)
    args.out.write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
