"""Tune the bundled demo model and measure it before and after, side by side in one run.

Here (CPU), about 20 minutes on 2 cores:

    python benchmarks/tune_demo.py --target cpu --trials 300 --minutes 20

On the GPU machine (needs the full TVM pack and xgboost; see ../shared/device/README.md). The model is imported
and prepared HERE, so the GPU machine needs neither onnxscript nor the same onnx version, and the model key (the
log's directory name) is this machine's:

    python benchmarks/tune_demo.py --target cuda-sm90 --prepare        # here: build/tune-demo/prepared-cuda-sm90.pkl
    python3 benchmarks/tune_demo.py --target cuda-sm90 --trials 400 --minutes 4 --out DIR   # there

1. ``tuning_job.tune`` (what ``tvmpipe tune --resume`` runs) into tuning_logs/T/<model key>/; after ``--minutes`` the
   job gets a SIGINT and stops once the batches in flight are committed, so a budget larger than the time allows
   still ends with a usable log.
2. Compact the log to the best ``--keep`` records per kernel (small enough to commit).
3. Compile twice from the same prepared module: without a log (DLight on GPU, TVM's default lowering on CPU) and
   with it (a kernel whose tuned records do not beat the default measured by the job keeps the default:
   ``kernels_kept_default``); check both against onnxruntime on the same random inputs; time both with TVM's time_evaluator
   (device-synchronised on CUDA), alternating rounds so that both see the same machine state.

Writes benchmarks/results/tuning-demo-T.json, or with ``--out DIR``: DIR/tuning-demo-T.json and a copy of the log
under DIR/tuning_logs/T/<key>/ (copy both into the repository).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import platform
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
MODEL = REPO / "models" / "demo.onnx"
SHAPES = {"image": (2, 3, 32, 32)}
BUILD = REPO / "build" / "tune-demo"


def tune(prep, trials: int, minutes: float | None, log: Path) -> dict:
    """Tune (resuming the log), SIGINT after ``minutes``; return the report."""
    from compiler import tuning_job

    timer = threading.Timer(minutes * 60, os.kill, (os.getpid(), signal.SIGINT)) if minutes else None
    if timer:
        timer.daemon = True
        timer.start()
    try:
        return tuning_job.tune(prep, trials=trials, log_dir=log, resume=True)
    except KeyboardInterrupt:
        print(f"tune_demo: stopped after {minutes} minutes", flush=True)
        return json.loads((log / "tuning_report.json").read_text())
    finally:
        if timer:
            timer.cancel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--minutes", type=float, help="stop tuning after this long (SIGINT)")
    ap.add_argument("--keep", type=int, default=4, help="records per kernel kept by compaction")
    ap.add_argument("--rounds", type=int, default=7, help="alternating timing rounds of 100 runs each")
    ap.add_argument("--prepare", action="store_true", help="only import and prepare the model (for another machine)")
    ap.add_argument("--out", type=Path, help="write the JSON and a copy of the log here (default: benchmarks/results)")
    args = ap.parse_args()

    from compiler import load, pipeline, tuning, tuning_log
    from compiler.compare import OrtSession, errors

    prepared = BUILD / f"prepared-{args.target}.pkl"
    if args.prepare:
        prep = pipeline.prepare(MODEL, args.target, SHAPES)
        prep = dataclasses.replace(prep, imported=dataclasses.replace(prep.imported, onnx_model=None))
        BUILD.mkdir(parents=True, exist_ok=True)
        prepared.write_bytes(pickle.dumps(prep))
        print(f"wrote {prepared} ({prepared.stat().st_size} bytes, model key {prep.key})")
        return
    prep = pickle.loads(prepared.read_bytes()) if prepared.exists() else pipeline.prepare(MODEL, args.target, SHAPES)
    log = REPO / tuning.log_dir(prep.target, prep.key)
    t0 = time.time()
    report = tune(prep, args.trials, args.minutes, log)
    tune_s = time.time() - t0
    before, after = tuning_log.compact(log, args.keep)
    print(f"compacted {log}: kept {after} of {before} records")

    manifests = {name: pipeline.compile_prepared(prep, BUILD / f"{name}.tvmpkg", pipeline.Options(tuning_log=use))
                 for name, use in (("before", None), ("after", log))}
    runners = {name: load(BUILD / f"{name}.tvmpkg") for name in manifests}
    inputs = runners["before"].random_inputs(seed=int(time.time()))
    ref = OrtSession(str(MODEL))(inputs)
    ms: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.rounds):
        for name, runner in runners.items():
            ms[name].append(runner.time(inputs, repeat=100, warmup=10).summary()["median_ms"])
    kernels = manifests["after"]["kernels"]
    result = {
        "benchmark": "demo model (models/demo.onnx, image 2x3x32x32) before/after MetaSchedule tuning",
        "command": "python benchmarks/tune_demo.py " + " ".join(sys.argv[1:]),
        "target": manifests["after"]["target"],
        "host": {"machine": platform.machine(), "processor": platform.processor(), "python": platform.python_version()},
        "tuning": {k: report.get(k) for k in ("model_key", "cost_model", "status", "trials", "trials_budget",
                                              "elapsed_s", "estimated_total_us", "estimated_default_us", "search")},
        "tuning_wall_s": round(tune_s, 1),
        "log": str(log.relative_to(REPO)),
        "kernels_tuned": sorted(k for k, v in kernels.items() if v == "tuned"),
        "kernels_kept_default": sorted(k for k, v in kernels.items() if v.endswith(" (tuned slower)")),
        "kernels_not_tuned": {k: v for k, v in kernels.items() if v != "tuned" and not v.endswith(" (tuned slower)")},
        "median_ms_per_round": ms,
        "before_ms": float(np.median(ms["before"])),
        "after_ms": float(np.median(ms["after"])),
        "speedup": float(np.median(ms["before"]) / np.median(ms["after"])),
        "errors_vs_onnxruntime": {name: errors(r(**inputs), ref) for name, r in runners.items()},
    }
    print(json.dumps({k: result[k] for k in ("before_ms", "after_ms", "speedup", "errors_vs_onnxruntime")}, indent=1))
    out = args.out or REPO / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"tuning-demo-{args.target}.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.out:
        dest = args.out / "tuning_logs" / args.target / prep.key
        dest.mkdir(parents=True, exist_ok=True)
        for name in (tuning_log.WORKLOADS, tuning_log.RECORDS, tuning_log.REPORT, tuning_log.CURVE):
            if (log / name).exists():
                shutil.copy(log / name, dest / name)
    print(f"wrote {out / f'tuning-demo-{args.target}.json'}")


if __name__ == "__main__":
    main()
