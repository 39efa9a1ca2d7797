"""Can our ordinary kernel path (s_tir TVMScript, TVM's default TIR pipeline, NVRTC) run Hopper's FA3 building
blocks? Two probe kernels written like ``schedules/attention_cuda.py``, built for ``sm_90a``, run on the GPU:

* ``wgmma``: one ``wgmma.mma_async`` m64n64k16 (f16 in, f32 accumulator) from shared-memory descriptors,
  operands in the no-swizzle core-matrix layout (8 x 16-byte rows per 128-byte block); the two spellings of
  the descriptor's leading/stride byte offsets are both built, the run says which one the hardware means;
* ``bulk``: warp specialisation: a producer warpgroup gives up registers (``setmaxnreg.dec``), one thread
  arms an ``mbarrier`` with the expected bytes and streams a tile into shared memory with
  ``cp.async.bulk`` (the TMA engine, no tensor map); the consumer warpgroup takes registers
  (``setmaxnreg.inc``), waits on the barrier's phase and writes the tile back with bulk copies.

    python benchmarks/hopper_probe.py --build            # here: build/gpu/hopper/probe.so (sm_90a cubin + PTX)
    python3 benchmarks/hopper_probe.py --run --out DIR   # GPU machine: DIR/hopper-probe.json

Two rules make this work without TVM's TIRx pipeline: the target arch is ``sm_90a`` (wgmma and setmaxnreg
exist only there), and shared-memory addresses reach the PTX as 32-bit shared-window integers taken once
at the top, so the s_tir pass that plans ``__syncthreads`` does not see (and refuse) shared accesses in the
producer / consumer branches; ``__launch_bounds__(threads, 1)`` keeps ptxas from dropping ``setmaxnreg``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
BUILD = REPO / "build" / "gpu" / "hopper"
LIB = BUILD / "probe.so"
N = 64  # wgmma n; m = 64, k = 16


def wgmma_kernel(lbo: int, sbo: int):
    """C[64, N] = A[64, 16] Bᵀ with B given as [N, 16]; ``lbo`` / ``sbo``: descriptor offsets in 16-byte units."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def wgmma(a: T.Buffer((64, 16), "float16"), b: T.Buffer((N, 16), "float16"), c: T.Buffer((64, N), "float32")):
        for bx in T.thread_binding(1, thread="blockIdx.x"):
            for tx in T.thread_binding(128, thread="threadIdx.x"):
                with T.sblock("wgmma"):
                    T.reads()
                    T.writes()
                    sa = T.alloc_buffer((64 * 16,), "float16", scope="shared", align=128)
                    sb = T.alloc_buffer((N * 16,), "float16", scope="shared", align=128)
                    acc = T.alloc_buffer((N // 2,), "float32", scope="local")
                    desc = T.alloc_buffer((2,), "uint64", scope="local")
                    for i in T.serial(8):  # element (r, k) -> 8x8 block (r // 8, k // 8), blocks of one row band adjacent
                        e = T.meta_var(tx * 8 + i)
                        sa[(e // 128 * 2 + e % 16 // 8) * 64 + e // 16 % 8 * 8 + e % 8] = a[e // 16, e % 16]
                        sb[(e // 128 * 2 + e % 16 // 8) * 64 + e // 16 % 8 * 8 + e % 8] = b[e // 16, e % 16]
                    T.ptx["fence.proxy.async.shared::cta"]()  # generic-proxy stores -> visible to wgmma's async proxy
                    T.tvm_storage_sync("shared")
                    for i in T.unroll(N // 2):
                        acc[i] = T.float32(0)
                    T.evaluate(T.cuda.wgmma.encode_matrix_descriptor(desc.access_ptr("w", offset=0), sa.access_ptr("r"), lbo, sbo, 0))
                    T.evaluate(T.cuda.wgmma.encode_matrix_descriptor(desc.access_ptr("w", offset=1), sb.access_ptr("r"), lbo, sbo, 0))
                    T.ptx["wgmma.fence.sync.aligned"]()
                    T.ptx[f"wgmma.mma_async.sync.aligned.m64n{N}k16.f32.f16.f16"](
                        *[acc[i] for i in range(N // 2)], desc[0], desc[1], T.bool(True), 1, 1, 0, 0)
                    T.ptx["wgmma.commit_group.sync.aligned"]()
                    T.ptx["wgmma.wait_group.sync.aligned"](0)
                    for i in T.unroll(N // 2):  # accumulator layout: warp w rows 16w.., then as mma.m16n8 per 8 columns
                        c[tx // 32 * 16 + tx % 32 // 4 + i % 4 // 2 * 8, i // 4 * 8 + tx % 4 * 2 + i % 2] = acc[i]

    return wgmma


def bulk_kernel():
    """out = a ([64, 128] float16) through shared memory: producer warpgroup -> mbarrier -> consumer warpgroup."""
    from tvm.script import tirx as T

    rows, row_bytes = 64, 256

    @T.prim_func(s_tir=True)
    def bulk(a: T.Buffer((64, 128), "float16"), out: T.Buffer((64, 128), "float16")):
        for bx in T.thread_binding(1, thread="blockIdx.x"):
            for tx in T.thread_binding(256, thread="threadIdx.x"):
                with T.attr(0, "tirx.launch_bounds_min_blocks_per_sm", 1):
                    with T.sblock("bulk"):
                        T.reads()
                        T.writes()
                        tile = T.alloc_buffer((64 * 128,), "float16", scope="shared", align=128)
                        bar = T.alloc_buffer((1,), "uint64", scope="shared", align=8)
                        addr = T.alloc_buffer((2,), "uint32", scope="local")  # shared-window addresses: barrier, tile
                        done = T.alloc_buffer((1,), "uint32", scope="local")
                        addr[0] = T.cuda.cvta_generic_to_shared(bar.access_ptr("rw"))
                        addr[1] = T.cuda.cvta_generic_to_shared(tile.access_ptr("rw"))
                        if tx == 0:
                            T.ptx["mbarrier.init.shared::cta.b64"](addr[0], 1)
                            T.ptx["fence.mbarrier_init.release.cluster"]()
                        T.tvm_storage_sync("shared")
                        if tx >= 128:  # producer
                            T.ptx["setmaxnreg.dec.sync.aligned.u32"](40)
                            if tx == 128:
                                T.ptx["mbarrier.arrive.expect_tx.shared::cta.b64"](addr[0], rows * row_bytes)
                                for r in T.serial(rows):
                                    T.ptx["cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"](
                                        addr[1] + T.uint32(r * row_bytes), a.access_ptr("r", offset=r * 128), row_bytes, addr[0])
                        else:  # consumer
                            T.ptx["setmaxnreg.inc.sync.aligned.u32"](232)
                            done[0] = T.uint32(0)
                            while done[0] == T.uint32(0):
                                T.ptx["mbarrier.try_wait.parity.shared::cta.b64"](done[0], addr[0], 0)
                            if tx == 0:
                                for r in T.serial(rows):
                                    T.ptx["cp.async.bulk.global.shared::cta.bulk_group"](
                                        out.access_ptr("w", offset=r * 128), addr[1] + T.uint32(r * row_bytes), row_bytes)
                                T.ptx["cp.async.bulk.commit_group"]()
                                T.ptx["cp.async.bulk.wait_group"](0)

    return bulk


KERNELS = {"wgmma_lbo_k": lambda: wgmma_kernel(8, 16), "wgmma_lbo_mn": lambda: wgmma_kernel(16, 8), "bulk": bulk_kernel}


def build() -> None:
    import tvm

    from compiler import targets
    from compiler.build import Built

    info = targets.resolve("cuda-sm90")  # (its arch is sm_90a)
    assert info.arch == "sm_90a", info.arch
    mod = tvm.IRModule({name: make().with_attr("global_symbol", name) for name, make in KERNELS.items()})
    exe = tvm.compile(mod, target=info.target)
    (cuda,) = exe.mod._collect_from_import_tree(lambda m: m.kind == "cuda")
    source = cuda.inspect_source("cuda")
    for insn in ("wgmma.mma_async", "mbarrier.try_wait", "cp.async.bulk.shared::cluster", "setmaxnreg.inc"):
        assert insn in source, insn
    BUILD.mkdir(parents=True, exist_ok=True)
    print(f"built {LIB}: {Built(exe, info).export(LIB)}")


def run(out: Path) -> None:
    import tvm

    from compiler.runtime import load_cuda_runtime

    load_cuda_runtime()  # a runtime-only TVM does not load its CUDA backend by itself
    lib, dev = tvm.runtime.load_module(str(LIB)), tvm.cuda(0)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 16)).astype(np.float16), rng.standard_normal((N, 16)).astype(np.float16)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    records = []
    for name in KERNELS:
        try:
            if name == "bulk":
                x = rng.standard_normal((64, 128)).astype(np.float16)
                y = tvm.runtime.tensor(np.zeros_like(x), dev)
                lib[name](tvm.runtime.tensor(x, dev), y)
                err = float(np.abs(y.numpy().astype(np.float64) - x).max())
            else:
                c = tvm.runtime.tensor(np.zeros((64, N), np.float32), dev)
                lib[name](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), c)
                err = float(np.abs(c.numpy() - ref).max() / np.abs(ref).max())
            records.append({"kernel": name, "max_err": err, "correct": err < 1e-3, "device": dev.device_name})
        except Exception as e:  # one failing probe must not hide the others
            records.append({"kernel": name, "error": f"{type(e).__name__}: {e}"})
        print(json.dumps(records[-1]), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hopper-probe.json").write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="store_true", help="compile the probes (here, with the TVM compiler)")
    ap.add_argument("--run", action="store_true", help="run and check them (GPU machine, TVM runtime)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args()
    if args.build:
        build()
    if args.run:
        run(args.out)
