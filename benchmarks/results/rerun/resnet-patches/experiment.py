"""ResNet-50 batch-32 fp16's conv patches (``gpu_conv2d._patches``) on the elementwise rule's kernel, timed alone.

``--build DIR`` compiles every geometry below with the ``schedules`` package this script imports (run it from
another checkout, ``PYTHONPATH=<that checkout>``, for a baseline), plus, with ``--variants``, the rule with 4 lanes
a thread; ``--run DIR [--baseline DIR2]`` (GPU machine) checks each kernel against ``torch.nn.functional.unfold``
and times it (L2 flushed, median), beside a device copy of the patches' size. Output: ``patches-<device>.json``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
# (in channels, input side, kernel, stride, pad, launches in ResNet-50): the convs whose B is their patches
GEOMETRIES = [
    (3, 224, 7, 2, 3, 1), (64, 56, 3, 1, 1, 3), (128, 56, 3, 2, 1, 1), (256, 56, 1, 2, 0, 1),
    (128, 28, 3, 1, 1, 3), (256, 28, 3, 2, 1, 1), (512, 28, 1, 2, 0, 1), (256, 14, 3, 1, 1, 5),
    (1024, 14, 1, 1, 0, 6), (256, 14, 1, 1, 0, 6), (512, 14, 3, 2, 1, 1), (1024, 14, 1, 2, 0, 1),
    (512, 7, 3, 1, 1, 2), (2048, 7, 1, 1, 0, 2), (512, 7, 1, 1, 0, 3),
]
BATCH = 32


def name(g: tuple, impl: str) -> str:
    return f"{impl}_c{g[0]}_h{g[1]}_k{g[2]}_s{g[3]}"


def build(folder: Path, variants: bool) -> None:
    import tvm
    from tvm import te

    from compiler import targets
    from compiler.build import Built
    from schedules import gpu_conv2d, gpu_elementwise

    target = targets.resolve("cuda-sm90")
    funcs, cases = {}, []
    kinds = [("rule", None)] + ([("lanes4", 4)] if variants else [])
    for g in GEOMETRIES:
        c, h, k, s, p, _ = g
        for impl, lanes in kinds:
            x = te.placeholder((BATCH, c, h, h), "float16", name="x")
            col = gpu_conv2d._patches(x, k, k, [s, s], [p] * 4, [1, 1])
            saved = getattr(gpu_elementwise, "SERIAL_LANES", None)
            if lanes:
                gpu_elementwise.SERIAL_LANES = lanes
            with target.target:
                sch = gpu_elementwise.GpuElementwise().apply(te.create_prim_func([x, col]), target.target, False)
            if lanes:
                gpu_elementwise.SERIAL_LANES = saved
            funcs[name(g, impl)] = sch.mod["main"].with_attr("global_symbol", name(g, impl))
            cases.append({"geometry": list(g), "impl": impl, "name": name(g, impl),
                          "shape": [int(d) for d in col.shape]})
    exe = tvm.compile(tvm.IRModule(funcs), target.target)
    folder.mkdir(parents=True, exist_ok=True)
    Built(exe, target).export(folder / "kernels.so")
    (folder / "cases.json").write_text(json.dumps(cases, indent=1))
    print(f"built {len(cases)} kernels -> {folder}")


def run(folder: Path, out: Path, baseline: Path | None) -> None:
    import torch
    import tvm
    import tvm_ffi

    from benchmarks.common import gpu_slug
    from benchmarks.softmax import gpu_bench
    from compiler.runtime import load_cuda_runtime

    load_cuda_runtime()
    libs = [("", tvm.runtime.load_module(str(folder / "kernels.so")), json.loads((folder / "cases.json").read_text()))]
    if baseline:
        libs.append(("baseline-", tvm.runtime.load_module(str(baseline / "kernels.so")),
                     json.loads((baseline / "cases.json").read_text())))
    device, records = gpu_slug(), []
    torch.manual_seed(0)
    with tvm_ffi.use_torch_stream():
        for g in GEOMETRIES:
            c, h, k, s, p, launches = g
            x = torch.randn(BATCH, c, h, h, dtype=torch.float16, device="cuda")
            ref = torch.nn.functional.unfold(x, k, padding=p, stride=s)
            shape = next(case["shape"] for case in libs[0][2] if case["geometry"] == list(g))
            want = torch.zeros(shape, dtype=torch.float16, device="cuda")
            want[:, :ref.shape[1], :ref.shape[2]] = ref
            y = torch.empty(shape, dtype=torch.float16, device="cuda")
            nbytes = y.numel() * 2 + x.numel() * 2
            src = torch.empty_like(y)
            copy_ms = gpu_bench(lambda: y.copy_(src), 50)
            xt, yt = tvm.runtime.from_dlpack(x), tvm.runtime.from_dlpack(y)
            for prefix, lib, cases in libs:
                for case in (cs for cs in cases if cs["geometry"] == list(g)):
                    fn = lib[case["name"]]
                    y.fill_(float("nan"))
                    fn(xt, yt)
                    exact = bool(torch.equal(y, want))
                    ms = gpu_bench(lambda: fn(xt, yt), 50)
                    r = {"impl": prefix + case["impl"], "geometry": list(g), "shape": shape, "ms": ms,
                         "tbps": nbytes / ms / 1e9, "copy_tbps": y.numel() * 4 / copy_ms / 1e9,
                         "launches": launches, "exact": exact, "device": device}
                    records.append(r)
                    print(f"{r['impl']:>16} {g}: {ms * 1e3:8.1f} us {r['tbps']:.2f} TB/s (copy {r['copy_tbps']:.2f})"
                          f" {'exact' if exact else 'WRONG'}", flush=True)
            del x, ref, want, y, src
    for impl in dict.fromkeys(r["impl"] for r in records):
        total = sum(r["ms"] * r["launches"] for r in records if r["impl"] == impl)
        print(f"{impl:>16}: ResNet-50's patches {total * 1e3:.0f} us")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"patches-{device}.json").write_text(json.dumps(records, indent=1))


def main() -> int:
    import argparse

    sys.path.insert(0, str(ROOT))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["build", "run"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--baseline", type=Path)
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("."))
    a = ap.parse_args()
    t0 = time.perf_counter()
    build(a.dir, a.variants) if a.mode == "build" else run(a.dir, a.out, a.baseline)
    print(f"{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
