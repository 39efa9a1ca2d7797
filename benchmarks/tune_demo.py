"""Tune the bundled demo model and measure it before and after, side by side in one run.

    python benchmarks/tune_demo.py --target cpu --trials 300 --minutes 20          # here
    python3 benchmarks/tune_demo.py --target cuda-sm90 --trials 400 --minutes 5 --out DIR   # GPU machine, full TVM

1. ``tvmpipe tune models/demo.onnx --target T --input-shape image:2x3x32x32 --trials N --resume`` in a subprocess;
   after ``--minutes`` it gets a SIGINT (the job stops once the batches in flight are committed), so a budget
   larger than the time allows still ends with a usable log. The log is tuning_logs/T/<model key>/.
2. ``tvmpipe tune ... --compact --keep K`` so that the log is small enough to commit.
3. Compile twice: without a log (DLight on GPU, TVM's default lowering on CPU) and with it; check both against
   onnxruntime on the same random inputs; time both with TVM's time_evaluator (device-synchronised on CUDA),
   alternating rounds so that both see the same machine state.

Writes benchmarks/results/tuning-demo-T.json, or with ``--out DIR``: DIR/tuning-demo-T.json and the log files
under DIR/tuning_logs/T/<key>/ (copy both into the repository).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
MODEL = REPO / "models" / "demo.onnx"
SHAPES = {"image": (2, 3, 32, 32)}


def tvmpipe(*args: str, minutes: float | None = None) -> None:
    """Run the CLI from the repository root; SIGINT it after ``minutes``."""
    cmd = [sys.executable, "-m", "compiler", *args]
    print("$", " ".join(cmd[2:]), flush=True)
    proc = subprocess.Popen(cmd, cwd=REPO)
    try:
        proc.wait(timeout=minutes * 60 if minutes else None)
    except subprocess.TimeoutExpired:
        print(f"tune_demo: {minutes} minutes are up: SIGINT", flush=True)
        proc.send_signal(signal.SIGINT)
        proc.wait()
    if proc.returncode not in (0, 130):
        sys.exit(f"tune_demo: {' '.join(args[:1])} failed with exit code {proc.returncode}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--minutes", type=float, help="stop tuning after this long (SIGINT)")
    ap.add_argument("--keep", type=int, default=4, help="records per kernel kept by --compact")
    ap.add_argument("--rounds", type=int, default=7, help="alternating timing rounds of 100 runs each")
    ap.add_argument("--out", type=Path, help="write the JSON and a copy of the log here (default: benchmarks/results)")
    args = ap.parse_args()

    from compiler import load, pipeline, tuning_log
    from compiler.compare import OrtSession, errors

    shape = "image:" + "x".join(map(str, SHAPES["image"]))
    common = [str(MODEL.relative_to(REPO)), "--target", args.target, "--input-shape", shape]
    t0 = time.time()
    tvmpipe("tune", *common, "--trials", str(args.trials), "--resume", minutes=args.minutes)
    tune_s = time.time() - t0
    tvmpipe("tune", *common, "--compact", "--keep", str(args.keep))

    prep = pipeline.prepare(MODEL, args.target, SHAPES)
    log = REPO / "tuning_logs" / args.target / prep.key
    report = json.loads((log / tuning_log.REPORT).read_text())
    build = REPO / "build" / "tune-demo"
    manifests = {
        "before": pipeline.compile_model(MODEL, args.target, build / "before.tvmpkg", SHAPES,
                                         pipeline.Options(tuning_log=None)),
        "after": pipeline.compile_model(MODEL, args.target, build / "after.tvmpkg", SHAPES,
                                        pipeline.Options(tuning_log=log)),
    }
    runners = {k: load(build / f"{k}.tvmpkg") for k in manifests}
    inputs = runners["before"].random_inputs(seed=int(time.time()))
    ref = OrtSession(str(MODEL))(inputs)
    ms: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(args.rounds):
        for k, runner in runners.items():
            ms[k].append(runner.time(inputs, repeat=100, warmup=10).summary()["median_ms"])
    result = {
        "benchmark": "demo model (models/demo.onnx, image 2x3x32x32) before/after MetaSchedule tuning",
        "command": "python benchmarks/tune_demo.py " + " ".join(sys.argv[1:]),
        "target": manifests["after"]["target"],
        "host": {"machine": platform.machine(), "processor": platform.processor(), "python": platform.python_version()},
        "tuning": {k: report[k] for k in ("model_key", "cost_model", "status", "trials", "trials_budget", "elapsed_s",
                                          "estimated_total_us", "search")},
        "tuning_wall_s": round(tune_s, 1),
        "log": str(log.relative_to(REPO)),
        "kernels_tuned": sorted(k for k, v in manifests["after"]["kernels"].items() if v == "tuned"),
        "kernels_not_tuned": {k: v for k, v in manifests["after"]["kernels"].items() if v != "tuned"},
        "median_ms_per_round": ms,
        "before_ms": float(np.median(ms["before"])),
        "after_ms": float(np.median(ms["after"])),
        "speedup": float(np.median(ms["before"]) / np.median(ms["after"])),
        "errors_vs_onnxruntime": {k: errors(r(**inputs), ref) for k, r in runners.items()},
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
