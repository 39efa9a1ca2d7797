"""Where a zoo model's time goes, kernel by kernel: compile variants of ``benchmarks/models.py`` and time each
kernel launch (``Runner.profile``), writing ``benchmarks/results/profile-<machine>.json``.

Run on the GPU machine (compiles there, like ``models.py --target cuda-sm90``)::

    python benchmarks/profile_zoo.py --target cuda-sm90 --variants gpt2:32:fp16 vit_b_16:1:fp32 --out $OUT

Packages are built without a CUDA graph so that every kernel is its own launch; each launch is timed between
two device syncs, so small kernels read high (launch + sync): the ranking of the big ones is the point.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402  (the zoo: export, compile, example inputs)

from compiler.runtime import load, profile_table  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="cpu", choices=["cpu", "cuda-sm90"])
    p.add_argument("--variants", nargs="+", required=True, metavar="MODEL:BATCH:PRECISION")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--jobs", type=int, default=4, help="parallel compiles")
    p.add_argument("--out", type=Path, default=models.RESULTS)
    args = p.parse_args(argv)
    variants = [(m, int(b), prec) for m, b, prec in (v.split(":") for v in args.variants)]
    records = []
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=mp.get_context("spawn")) as pool:
        jobs = [pool.submit(models.compile_package, m, b, args.target, prec, False, False) for m, b, prec in variants]
        for (model, batch, precision), job in zip(variants, jobs):
            built = job.result()
            rec = {"model": model, "batch": batch, "precision": precision, "target": args.target}
            if "error" in built:
                print(f"{model} b{batch} {precision}: FAILED {built['error']}", flush=True)
                records.append({**rec, "error": built["error"]})
                continue
            runner = load(built["package"])
            inputs = models.MODELS[model].example(batch)
            kernels = runner.profile(inputs, repeat=args.repeat)
            rec.update(total_ms=sum(k.ms for k in kernels), kernels=[vars(k) for k in kernels])
            print(f"\n{model} b{batch} {precision} ({args.target}): {rec['total_ms']:.3f} ms summed over kernels")
            print("\n".join(profile_table(kernels)), flush=True)
            records.append(rec)
            del runner
    machine = models.machine_name(args.target)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"profile-{machine}.json"
    path.write_text(json.dumps({"machine": machine, "records": records}, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
