"""Experiment (issue #4): L2 eviction priorities in the streamed softmax kernel, part by part, on 16 x 1M float32
(the one benchmark shape whose pass 2 re-reads steps from L2). The kernel as TVM generates it with the priorities
(``softmax_tir._L2_SRC``), its helpers' bodies swapped for plain accesses piece by piece, each stamped and timed by
``benchmarks/softmax_phases.py`` side by side (one folder, one run: rounds in random order).

    python3 benchmarks/results/rejected/l2-hints-one-kernel/variants.py  # here: build/gpu/softmax-l2/{main,crash-*}
    python3 benchmarks/softmax_phases.py --run --dir build/gpu/softmax-l2/main --out DIR   # GPU machine (CuPy)

``crash-*``: 4096 x 50257 float32 in 512-thread blocks with 3 cached steps (a variant of the main benchmark, which
stopped the GPU with an illegal instruction when built with all the priorities): with all of them, and without the
cp.async one.
"""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

_LD_HINTED = ('uint4 v; asm("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;" : "=r"(v.x), "=r"(v.y), '
              '"=r"(v.z), "=r"(v.w) : "l"(src), "l"(tvmpipe_l2_policy(KEEP))); *(uint4*)dst = v;')
_PLAIN = "*(uint4*)dst = *(const uint4*)src;"
LD = {"plain": _PLAIN, "hint": _LD_HINTED.replace("KEEP", "keep"),  # (as _L2_SRC: evict-last where keep, else first)
      "keep": f"if (keep) {{ {_LD_HINTED.replace('KEEP', '1')} }} else {_PLAIN}"}  # evict-last where keep, else plain
ST = {"plain": _PLAIN, "cs": "__stcs((uint4*)dst, *(const uint4*)src);"}
_CP = 'asm volatile("cp.async.cg.shared.global%s [%%0], [%%1], 16%s;" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src)%s : "memory");'
CP = {"plain": _CP % ("", "", ""), "first": _CP % (".L2::cache_hint", ", %2", ', "l"(tvmpipe_l2_policy(0))')}
VARIANTS = {  # name: (load, store, cp.async)
    "plain": ("plain", "plain", "plain"), "all": ("hint", "cs", "first"), "no_cp": ("hint", "cs", "plain"),
    "keep_st": ("keep", "cs", "plain"), "keep_only": ("keep", "plain", "plain"), "st_only": ("plain", "cs", "plain"),
}


def helpers(l2_src: str, ld: str, st: str, cp: str) -> str:
    """The helpers of ``l2_src`` (``softmax_tir._L2_SRC``) with these bodies (``all``: the same accesses)."""
    policy = l2_src[l2_src.index("__forceinline__ __device__ unsigned long long"):l2_src.index("__forceinline__ __device__ void tvmpipe_ld16")]
    return ("\n#ifndef TVMPIPE_L2_HINTS\n#define TVMPIPE_L2_HINTS\n" + policy
            + f"__forceinline__ __device__ void tvmpipe_ld16(void* dst, const void* src, int keep) {{ {LD[ld]} }}\n"
            + f"__forceinline__ __device__ void tvmpipe_cp16(void* dst, const void* src) {{ {CP[cp]} }}\n"
            + f"__forceinline__ __device__ void tvmpipe_st16(void* dst, const void* src) {{ {ST[st]} }}\n#endif\n")


def build(folder: Path, rows: int, cols: int, dtype: str, plan, variants: dict) -> None:
    import tvm

    import schedules.softmax as S
    from benchmarks.softmax_phases import compile_with_dyn_shmem, stamped
    from compiler import targets
    from schedules.softmax_tir import _L2_SRC

    target = targets.resolve("cuda-sm90").target
    mod, smem = compile_with_dyn_shmem(S.schedule_cuda(rows, cols, dtype, "softmax", plan).mod, target)
    base = mod.mod.imports[0].inspect_source()
    assert _L2_SRC in base
    folder.mkdir(parents=True, exist_ok=True)
    manifest = []
    for v, parts in variants.items():
        name = f"{dtype}_{rows}x{cols}_{v}"
        (folder / f"{name}.cu").write_text(stamped(base.replace(_L2_SRC, helpers(_L2_SRC, *parts))))
        subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-O3", "-w", "-o", folder / f"{name}.cubin",
                        folder / f"{name}.cu"], check=True)
        manifest.append({"name": name, "rows": rows, "cols": cols, "dtype": dtype,
                         "itemsize": tvm.DataType(dtype).bits // 8, "grid": rows * plan.chunks, "block": plan.lanes,
                         "smem": smem, "plan": str(plan), "variant": v, "parts": parts})
        print(name, flush=True)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    out = REPO / "build" / "gpu" / "softmax-l2"
    from schedules.softmax import CudaPlan, cuda_plan

    build(out / "main", 16, 1 << 20, "float32", cuda_plan(16, 1 << 20, "float32", "sm_90"), VARIANTS)
    crash = CudaPlan(512, 4, 4, cache="l2", cached=3)
    for v in ("all", "no_cp"):
        build(out / f"crash-{v}", 4096, 50257, "float32", crash, {v: VARIANTS[v]})
