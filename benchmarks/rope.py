"""Rotary embeddings on the GPU: ``x * cos + rotate_half(x) * sin`` (rotate_half = cat(-x2, x1) over the head dim,
a select on the innermost axis) as ``schedules/gpu_elementwise.py`` schedules it (vectors, the select's test read at
each vector's first element), against DLight's ``Fallback`` on the same PrimFunc (how such kernels ran before),
torch's eager expression and a device copy of ``x``, in one run, checked against float64.

    python benchmarks/rope.py --build              # here: build/gpu/rope/kernels.so + cases.json
    python3 benchmarks/rope.py --run --out DIR     # GPU machine -> DIR/rope-<gpu>.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import build_or_run, cuda_ms, gpu_slug, interleaved, rotation  # noqa: E402

BUILD = REPO / "build" / "gpu" / "rope"
# [batch, heads, seq, head dim]: a prefill's queries (Llama-style 32 heads of 128), a long prompt, 64-dim heads
SHAPES = [(8, 32, 1024, 128), (1, 32, 8192, 128), (16, 16, 1024, 64)]
DTYPES = ("float16", "float32")
IMPLS = ("tvmpipe", "dlight")
ROUNDS, REPS = 8, 20  # rounds, interleaved; calls timed per round (each between two CUDA events)
TOL = {"float16": 2e-3, "float32": 1e-5}  # normwise: max |y - ref| / max |ref|


def rope_func(shape: tuple[int, ...], dtype: str):
    """The kernel's PrimFunc: x [b, h, s, d], cos / sin [1, 1, s, d] -> x * cos + rotate_half(x) * sin."""
    from tvm import te, topi

    b, h, s, d = shape
    x = te.placeholder(shape, dtype, name="x")
    cos, sin = (te.placeholder((1, 1, s, d), dtype, name=n) for n in ("cos", "sin"))
    rot = topi.concatenate([topi.negative(topi.strided_slice(x, [0, 0, 0, d // 2], [b, h, s, d])),
                            topi.strided_slice(x, [0, 0, 0, 0], [b, h, s, d // 2])], 3)
    return te.create_prim_func([x, cos, sin, topi.add(topi.multiply(x, cos), topi.multiply(rot, sin))])


def build() -> None:
    import tvm
    from tvm.s_tir.dlight.gpu import Fallback

    from compiler import targets
    from compiler.build import Built
    from schedules.gpu_elementwise import GpuElementwise

    target = targets.resolve("cuda-sm90")
    funcs, cases = {}, []
    for shape in SHAPES:
        for dtype in DTYPES:
            func = rope_func(shape, dtype)
            for impl, rule in (("tvmpipe", GpuElementwise()), ("dlight", Fallback())):
                with target.target:
                    sch = rule.apply(func, target.target, False)
                assert sch is not None, (impl, shape, dtype)
                name = f"{impl}_{dtype}_{'x'.join(map(str, shape))}"
                funcs[name] = sch.mod["main"].with_attr("global_symbol", name)
                cases.append({"name": name, "impl": impl, "shape": shape, "dtype": dtype})
    BUILD.mkdir(parents=True, exist_ok=True)
    Built(tvm.compile(tvm.IRModule(funcs), target.target), target).export(BUILD / "kernels.so")
    (BUILD / "cases.json").write_text(json.dumps(cases, indent=1))
    print(f"built {len(cases)} kernels -> {BUILD}")


def run(out: Path) -> None:
    import torch
    import tvm
    import tvm_ffi

    from compiler.runtime import load_cuda_runtime

    load_cuda_runtime()
    lib = tvm.runtime.load_module(str(BUILD / "kernels.so"))
    cases = json.loads((BUILD / "cases.json").read_text())
    device, records = gpu_slug(), []
    tdt = {"float16": torch.float16, "float32": torch.float32}
    with tvm_ffi.use_torch_stream():
        for shape in map(tuple, SHAPES):
            b, h, s, d = shape
            for dtype in DTYPES:
                x = torch.randn(shape, dtype=tdt[dtype], device="cuda")
                cos, sin = (torch.randn(1, 1, s, d, dtype=tdt[dtype], device="cuda") for _ in range(2))
                y = torch.empty_like(x)

                def rotate_half(t):
                    return torch.cat([-t[..., d // 2:], t[..., :d // 2]], -1)

                x64, c64, s64 = x.double(), cos.double(), sin.double()
                ref = x64 * c64 + rotate_half(x64) * s64
                args = [tvm.runtime.from_dlpack(t) for t in (x, cos, sin, y)]
                fns = {c["impl"]: (lambda f=lib[c["name"]]: (f(*args), y)[1])
                       for c in cases if (tuple(c["shape"]), c["dtype"]) == (shape, dtype)}
                fns["torch"] = lambda: x * cos + rotate_half(x) * sin
                errs = {}
                for impl, fn in fns.items():
                    y.fill_(float("nan"))
                    errs[impl] = float(((fn().double() - ref).abs().max() / ref.abs().max()).item())
                fns["copy"] = lambda: y.copy_(x)
                nbytes = 2 * x.numel() * x.element_size()  # x read, y written (cos / sin: 1 / (b h) of that)
                times = interleaved({n: (lambda fn=fn: cuda_ms(fn, repeat=REPS, warmup=1)) for n, fn in fns.items()},
                                    ROUNDS, order=rotation(list(fns)), pause=lambda: None)
                ms = {n: statistics.median(t) for n, t in times.items()}
                for impl in (*IMPLS, "torch"):
                    rec = {"impl": impl, "shape": list(shape), "dtype": dtype, "ms": ms[impl],
                           "tbps": nbytes / ms[impl] / 1e9, "copy_tbps": nbytes / ms["copy"] / 1e9,
                           "max_err": errs[impl], "ok": errs[impl] <= TOL[dtype], "device": device}
                    records.append(rec)
                    print(f"{impl:>8} {dtype} {shape}: {rec['ms']:.4f} ms {rec['tbps']:.2f} TB/s "
                          f"(copy {rec['copy_tbps']:.2f}) err {rec['max_err']:.1e}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"rope-{device}.json"
    path.write_text(json.dumps(records, indent=1))
    print(f"wrote {path}; {sum(not r['ok'] for r in records)} numerics failures")


def main() -> int:
    args = build_or_run(__doc__, "kernels").parse_args()
    build() if args.build else run(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
