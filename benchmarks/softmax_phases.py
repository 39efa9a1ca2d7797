"""Where the time of softmax's block kernel goes (issue #4): the rule's CUDA kernels for the long-row shapes, each
block stamping the GPU's global timer at its phase boundaries, run beside a device copy of the same bytes.

    python3 benchmarks/softmax_phases.py --build           # here (TVM + nvcc): build/gpu/softmax-phases/
    python3 benchmarks/softmax_phases.py --run --out DIR   # GPU machine (CuPy): DIR/softmax-phases-<device>.json
    (``--dir``: another build folder, e.g. one built from an earlier commit: its results file gets the folder's name)

The stamps are text added to the CUDA source that TVM generates for the rule's plan: at the kernel's entry, where
pass 1 ends (before the first block reduction), where pass 2 starts (after the merge; the split's exchange
included) and after a barrier at its end; thread 0 writes them, with its SM's id, to an extra kernel argument.
Nothing else in the kernel changes: a stamp is a few instructions, plus the one barrier at the end. (Nsight Compute
gives whole-kernel figures; Nsight Systems, not per-block phases.) Each launch's times are in us from its first
block's start; per case the median over ``LAUNCHES`` launches of the median and last block's time at each boundary,
with L2 in three states at launch (``phases_us_by_l2``: the previous launch's output in it, dirty; clean; a 256 MB
buffer just zeroed, dirty), and each SM's pass 2 time (to tell a slow SM from a slow launch: ``sm_pass2_corr``
correlates the SMs' times in odd against even launches). ``us`` / ``of_copy``: the stamped kernel timed as the main
benchmark times (``ROUNDS`` rounds in random order, ``REPEAT`` back-to-back launches each) against
``cudaMemcpyAsync`` of the same bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BUILD = REPO / "build" / "gpu" / "softmax-phases"
SHAPES = [(1024, 32768), (128, 131072), (16, 1048576)]  # streamed rows: one wave of blocks or several
DTYPES = ("float32", "float16")
LAUNCHES, ROUNDS, REPEAT = 16, 8, 20
PHASES = ("start", "pass1", "merged", "end")

_STAMP = 'asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(stamp_t[%d]));'
_WRITE = ('__syncthreads();\n  %s\n  if (threadIdx.x == 0) { unsigned sm; asm("mov.u32 %%0, %%%%smid;" : "=r"(sm)); '
          'for (int i = 0; i < 4; ++i) stamps_ptr[blockIdx.x * 5 + i] = stamp_t[i]; '
          'stamps_ptr[blockIdx.x * 5 + 4] = sm; }\n')


def _with_stamps_arg(text: str) -> str:
    """The kernel's declarations in ``text`` with one more argument, the stamps."""
    return text.replace("yf_ptr)", "yf_ptr, unsigned long long* __restrict__ stamps_ptr)")


def stamped(src: str) -> str:
    """``src`` (one streamed softmax kernel from TVM) with the phase stamps (see the module docstring)."""
    entry = re.search(r"extern \"C\" __global__ void __launch_bounds__\(\d+\) \w+\((\w+)\* __restrict__ xf_ptr, "
                      r"\w+\* __restrict__ yf_ptr\) \{\n", src)
    reduce = src.find("__shfl_xor_sync((uint)4294967295, st_ptr[0], 1, 32)")
    pass2 = src.rfind("\n  for (int ti = 0;")
    if entry is None or reduce < 0 or pass2 < 0 or not src.rstrip().endswith("}"):
        raise ValueError("the generated kernel no longer has the structure the stamps are placed by")
    end = src.rstrip().rfind("}")
    reduce = src.rfind("\n", 0, reduce)
    return (_with_stamps_arg(src[:entry.start()]) + _with_stamps_arg(entry.group(0))
            + "  unsigned long long stamp_t[4];\n  " + _STAMP % 0 + "\n"
            + src[entry.end():reduce] + "\n  " + _STAMP % 1 + src[reduce:pass2] + "\n  " + _STAMP % 2
            + src[pass2:end] + "  " + _WRITE % (_STAMP % 3) + src[end:])


_DYN_SHMEM = re.compile(r'alloc_buffer\(\((\d+),\), "uint8", scope="shared\.dyn"\)')


def compile_with_dyn_shmem(mod, target):
    """``tvm.compile(mod, target)`` and the bytes of dynamic shared memory its one kernel takes, as TVM sized it (the
    buffer MergeSharedMemoryAllocations makes of all shared.dyn ones, read from the IR rather than re-derived from the
    plan: TVM's host code passes that size at launch, and a launch from CuPy must pass it too)."""
    import tvm

    sizes: list[int] = []

    @tvm.instrument.pass_instrument
    class Grab:
        def run_after_pass(self, module, info):
            if info.name.endswith("MergeSharedMemoryAllocations"):
                sizes.extend(int(n) for n in _DYN_SHMEM.findall(module.script()))

    with tvm.transform.PassContext(instruments=[Grab()]):
        lib = tvm.compile(mod, target)
    if len(sizes) != 1:
        raise ValueError(f"expected one merged shared.dyn buffer in the kernel, found {len(sizes)}")
    return lib, sizes[0]


def build(folder: Path) -> None:
    """The rule's kernel per shape and dtype, stamped, compiled to cubin with nvcc; ``manifest.json`` beside them."""
    import tvm

    import schedules.softmax as S
    from compiler import targets

    target = targets.resolve("cuda-sm90").target
    arch = str(target.attrs["arch"])
    folder.mkdir(parents=True, exist_ok=True)
    manifest = []
    for (rows, cols), dtype in ((s, d) for s in SHAPES for d in DTYPES):
        plan = S.cuda_plan(rows, cols, dtype, "sm_90")
        mod, smem = compile_with_dyn_shmem(S.schedule_cuda(rows, cols, dtype, "softmax", plan).mod, target)
        name = f"{dtype}_{rows}x{cols}"
        (folder / f"{name}.cu").write_text(stamped(mod.mod.imports[0].inspect_source()))
        subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-O3", "-w", "-o", folder / f"{name}.cubin",
                        folder / f"{name}.cu"], check=True)
        manifest.append({"name": name, "rows": rows, "cols": cols, "dtype": dtype,
                         "itemsize": tvm.DataType(dtype).bits // 8, "grid": rows * plan.chunks, "block": plan.lanes,
                         "smem": smem, "plan": str(plan)})
        print(name, plan, flush=True)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))


def run(folder: Path, out: Path) -> None:
    """Each stamped kernel: checked against float64, its phases over LAUNCHES launches, then timed with the copy."""
    import cupy as cp
    import numpy as np

    from benchmarks.common import gpu_slug

    cases, timed = json.loads((folder / "manifest.json").read_text()), {}
    # What L2 holds when a launch starts: the previous launch's output (dirty, as in back-to-back calls); what a read
    # of a 256 MB buffer left (clean: the dirty lines written back); that buffer zeroed (dirty, as after the main
    # benchmark's flush).
    scratch = cp.empty(256 << 20, dtype=cp.int8)
    preludes = {"previous output": lambda: None, "clean": lambda: scratch.max(),
                "zeroed 256 MB": lambda: scratch.fill(0)}
    for case in cases:
        kernel = cp.RawModule(path=str(folder / f"{case['name']}.cubin")).get_function("func_kernel")
        kernel.max_dynamic_shared_size_bytes = case["smem"]
        x = (cp.random.standard_normal((case["rows"], case["cols"]), dtype=cp.float32) * 4).astype(case["dtype"])
        y, z = cp.empty_like(x), cp.empty_like(x)
        stamps = cp.zeros((case["grid"], 5), dtype=cp.uint64)

        def launch(kernel=kernel, x=x, y=y, stamps=stamps, case=case):
            kernel((case["grid"],), (case["block"],), (x, y, stamps), shared_mem=case["smem"])

        launch()
        xf = x.astype(cp.float64)
        ref = cp.exp(xf - xf.max(axis=1, keepdims=True))
        ref /= ref.sum(axis=1, keepdims=True)
        case["max_err"] = float(cp.abs(y.astype(cp.float64) - ref).max())
        case["ok"] = case["max_err"] <= (1e-5 if case["dtype"] == "float32" else 2e-3)
        for prelude, before in preludes.items():
            at, sm_pass2 = [], []
            for _ in range(LAUNCHES):
                before()
                launch()
                s = stamps.get().astype(np.int64)
                t = (s[:, :4] - s[:, 0].min()) / 1e3
                at.append([f(t[:, i]) for i in range(4) for f in (np.median, np.max)])
                blocks = np.bincount(s[:, 4], minlength=256)[:256]
                with np.errstate(invalid="ignore"):  # (SMs without a block in this launch: NaN)
                    sm_pass2.append(np.bincount(s[:, 4], weights=t[:, 3] - t[:, 2], minlength=256)[:256] / blocks)
            at = np.median(np.array(at), axis=0)
            case.setdefault("phases_us_by_l2", {})[prelude] = {
                f"{p}_{w}": round(float(at[2 * i + j]), 3) for i, p in enumerate(PHASES)
                for j, w in enumerate(("median", "last"))}
            if prelude == "previous output":  # (the SMs' pass 2 times below are this state's)
                case["phases_us"], sm = case["phases_us_by_l2"][prelude], np.array(sm_pass2)
        always, ran = ~np.isnan(sm).any(axis=0), np.flatnonzero(~np.isnan(sm).all(axis=0))
        if case["grid"] <= cp.cuda.Device().attributes["MultiProcessorCount"]:  # one wave: a block's time is its SM's
            case["sm_pass2_us"] = {int(i): round(float(v), 3) for i, v in zip(ran, np.nanmedian(sm[:, ran], axis=0))}
            odd, even = sm[0::2, always].mean(0), sm[1::2, always].mean(0)
            case["sm_pass2_corr"] = round(float(np.corrcoef(odd, even)[0, 1]), 3)
        nbytes = x.nbytes
        timed[case["name"]] = launch
        timed[f"copy {case['name']}"] = (lambda z=z, x=x, n=nbytes: cp.cuda.runtime.memcpyAsync(
            z.data.ptr, x.data.ptr, n, cp.cuda.runtime.memcpyDeviceToDevice, cp.cuda.get_current_stream().ptr))
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    rounds = {name: [] for name in timed}
    for r in range(ROUNDS):
        order = list(timed)
        random.Random(r).shuffle(order)
        for name in order:
            timed[name]()  # (warm-up)
            start.record()
            for _ in range(REPEAT):
                timed[name]()
            stop.record()
            stop.synchronize()
            rounds[name].append(cp.cuda.get_elapsed_time(start, stop) * 1e3 / REPEAT)
    for case in cases:
        case["us"] = float(np.median(rounds[case["name"]]))
        case["copy_us"] = float(np.median(rounds[f"copy {case['name']}"]))
        case["of_copy"] = round(case["copy_us"] / case["us"], 3)
        case["device"] = gpu_slug()
        print(case["name"], f"{case['us']:.2f} us, {case['of_copy']:.3f} of copy, ok {case['ok']}",
              json.dumps(case["phases_us_by_l2"]), f"SM corr {case.get('sm_pass2_corr')}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "" if folder.resolve() == BUILD else f"-{folder.name}"
    (out / f"softmax-phases-{cases[0]['device']}{suffix}.json").write_text(json.dumps(cases, indent=1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--build", action="store_true", help="stamp and compile the kernels here (TVM, nvcc)")
    mode.add_argument("--run", action="store_true", help="run them on the GPU (CuPy)")
    p.add_argument("--dir", type=Path, default=BUILD, help="the build folder")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = p.parse_args(argv)
    build(args.dir) if args.build else run(args.dir, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
