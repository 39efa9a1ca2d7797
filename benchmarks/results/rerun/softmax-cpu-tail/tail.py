"""CPU softmax with a ``cols % lanes`` tail: the overlapping vector step (this tree's ``softmax_tir.cpu``) against the
scalar tail it replaced (``softmax_tir.py`` at ``--baseline``), with onnxruntime, interleaved in one process
(``benchmarks.softmax``'s CPU timing: best of 60 calls each). The kernels as ``schedule_cpu`` builds them.

    python benchmarks/results/rerun/softmax-cpu-tail/tail.py [--baseline COMMIT] [--out run1.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
# rows x cols, dtype: short odd rows (a mixture-of-experts router's 60 experts, 120), a classifier's 1000 classes,
# odd long rows (1025, GPT-2's vocabulary), and one without a tail (the control)
SHAPES = [(8192, 120, "float32"), (8192, 120, "float16"), (16384, 60, "float32"), (1024, 1000, "float32"),
          (1024, 1000, "float16"), (4096, 1025, "float32"), (64, 50257, "float32"), (1024, 1024, "float32")]


def baseline_module(commit: str):
    """``schedules/softmax_tir.py`` at ``commit``, imported as a module of its own."""
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:schedules/softmax_tir.py"], capture_output=True,
                         text=True, check=True).stdout.replace("from .", "from schedules.")
    path = Path(tempfile.mkdtemp()) / "softmax_tir_baseline.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("softmax_tir_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    import tvm

    from benchmarks.softmax import _cpu_bench_interleaved, cpu_kernel, ort_softmax
    from compiler import targets
    from schedules import softmax_tir
    from schedules.softmax import cpu_lanes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="c8fe67e", help="commit whose scalar tail is compared")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("run1.json"))
    args = ap.parse_args()
    info = targets.resolve("cpu")
    lanes = cpu_lanes(info.target)
    old_module = baseline_module(args.baseline)

    def build(module, rows: int, cols: int, dtype: str):
        prefetch = rows > 1 and cols * np.dtype(dtype).itemsize <= 256 << 10  # (schedule_cpu's rule at the time)
        return cpu_kernel(module.cpu(rows, cols, dtype, "softmax", lanes, prefetch, dtype != "float32"), "softmax",
                          info.target)

    rng, records = np.random.default_rng(0), []
    for rows, cols, dtype in SHAPES:
        xt = tvm.runtime.tensor((rng.standard_normal((rows, cols)) * 4).astype(dtype))
        yt = tvm.runtime.empty((rows, cols), dtype)
        new, old = build(softmax_tir, rows, cols, dtype), build(old_module, rows, cols, dtype)
        fns = {"onnxruntime": ort_softmax(np.from_dlpack(xt), np.from_dlpack(yt), info.cores),
               "tvmpipe": lambda: new(xt, yt), "scalar-tail": lambda: old(xt, yt)}
        best = _cpu_bench_interleaved(fns, dict.fromkeys(fns, 60))
        rec = {"rows": rows, "cols": cols, "dtype": dtype, "lanes": lanes, "tail": cols % lanes,
               **{f"{k}_ms": v for k, v in best.items()},
               "speedup_vs_scalar_tail": best["scalar-tail"] / best["tvmpipe"],
               "vs_onnxruntime": best["onnxruntime"] / best["tvmpipe"],
               "scalar_tail_vs_onnxruntime": best["onnxruntime"] / best["scalar-tail"],
               "cpu": info.isa_summary(), "threads": info.cores, "baseline": args.baseline}
        print(json.dumps(rec), flush=True)
        records.append(rec)
    args.out.write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
