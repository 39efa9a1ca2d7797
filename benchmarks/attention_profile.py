"""Nsight Compute side by side: tvmpipe's attention kernel against torch SDPA's cuDNN and flash kernels (issue #5),
on the benchmark's non-causal seq-2048 shapes (d 128 and 64), to say where the gap to cuDNN is.

    python3 benchmarks/attention_profile.py --build          # here: the rule's kernels -> build/gpu/attention-profile/
    python3 benchmarks/attention_profile.py --run --out DIR  # GPU machine with ncu: DIR/attention-ncu-<gpu>.json

``--run`` profiles each implementation in its own process (``ncu`` over ``--launch IMPL``, three calls per shape,
the last one kept) with the speed-of-light, compute, occupancy, launch, scheduler and warp-state sections and the L2 and
DRAM byte counters, keeping some of their figures per kernel. ncu locks the clocks, so durations differ from
the benchmark's; ratios do not much.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.attention import CASES  # noqa: E402
from benchmarks.common import gpu_slug  # noqa: E402

LIB = REPO / "build" / "gpu" / "attention-profile" / "attention.so"
PROFILED = [c for c in CASES if c.name in ("bench_d128_s2048_full", "bench_d64_s2048_full")]
IMPLS = {"tvmpipe": "regex:bench_", "torch-cudnn": "regex:cudnn", "torch-flash": "regex:flash_fwd"}
SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "Occupancy", "LaunchStats", "SchedulerStats", "WarpStateStats")
# (record key, ncu metric name): what the comparison rests on
METRICS = (("duration_ns", "Duration"), ("elapsed_cycles", "Elapsed Cycles"), ("grid", "Grid Size"),
           ("block", "Block Size"), ("registers", "Registers Per Thread"),
           ("shared_bytes", "Dynamic Shared Memory Per Block"), ("sm_throughput_pct", "Compute (SM) Throughput"),
           ("l2_throughput_pct", "L2 Cache Throughput"), ("dram_throughput_pct", "DRAM Throughput"),
           ("issued_ipc", "Issued Ipc Active"), ("active_warps_per_scheduler", "Active Warps Per Scheduler"),
           ("warp_cycles_per_issue", "Warp Cycles Per Issued Instruction"),
           ("l2_bytes", "lts__t_bytes.sum"), ("dram_read_bytes", "dram__bytes_read.sum"))
RAW = [name for _, name in METRICS if "__" in name]


def launch(impl: str) -> None:
    """Three calls of ``impl`` per profiled shape, on the same random inputs (what ncu watches)."""
    import torch
    import torch.nn.functional as F
    import tvm
    import tvm_ffi
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from compiler.runtime import load_cuda_runtime

    load_cuda_runtime()
    lib = tvm.runtime.load_module(str(LIB)) if impl == "tvmpipe" else None
    backend = {"torch-cudnn": SDPBackend.CUDNN_ATTENTION, "torch-flash": SDPBackend.FLASH_ATTENTION}.get(impl)
    for case in PROFILED:
        q, k, v = (torch.randn(case.batch, case.seq_q, case.heads, case.head_dim, device="cuda", dtype=torch.float16)
                   for _ in range(3))
        o = torch.empty_like(q)
        for _ in range(3):
            if lib is not None:
                with tvm_ffi.use_torch_stream():
                    lib[case.name](*(tvm.runtime.from_dlpack(t) for t in (q, k, v, o)))
            else:
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
        torch.cuda.synchronize()


def number(text: str) -> float:
    return float(text.replace(",", ""))


def profile(impl: str) -> list[dict]:
    """ncu over ``launch(impl)``: the last of each shape's three calls, METRICS of it."""
    sections = [a for s in SECTIONS for a in ("--section", s)]
    cmd = ["ncu", "--csv", "--page", "details", "--print-units", "base", "-k", IMPLS[impl], *sections,
           "--metrics", ",".join(RAW), sys.executable, __file__, "--launch", impl]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    kernels: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO("".join(line + "\n" for line in out.splitlines() if not line.startswith("==")))):
        kernels.setdefault(row["ID"], {"kernel": row["Kernel Name"][:120]})[row["Metric Name"]] = row["Metric Value"]
    launches = list(kernels.values())
    assert len(launches) == 3 * len(PROFILED), f"{impl}: {len(launches)} kernels profiled"
    return [{"impl": impl, "d": case.head_dim, "seq": case.seq_q, "batch": case.batch, "heads": case.heads,
             "kernel": got["kernel"], **{key: number(got[name]) for key, name in METRICS}}
            for case, got in zip(PROFILED, launches[2::3])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--build", action="store_true", help="compile the rule's kernels (here, TVM compiler)")
    mode.add_argument("--run", action="store_true", help="profile them and torch's beside them (GPU machine, ncu)")
    mode.add_argument("--launch", choices=IMPLS, help="(what --run profiles)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args(argv)
    if args.build:
        from benchmarks.attention import build

        build(PROFILED, LIB, variants=False)
    elif args.launch:
        launch(args.launch)
    else:
        device = gpu_slug()
        records = [r | {"device": device} for impl in IMPLS for r in profile(impl)]
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"attention-ncu-{device}.json"
        path.write_text(json.dumps(records, indent=1))
        for r in records:
            print(f"{r['impl']:>12} d{r['d']}: {r['duration_ns'] / 1e3:7.1f} us, SM {r['sm_throughput_pct']:5.1f} %, "
                  f"L2 {r['l2_throughput_pct']:5.1f} %, IPC {r['issued_ipc']:.2f}, {r['registers']:.0f} regs x "
                  f"{r['block']:.0f} threads, grid {r['grid']:.0f}; L2 {r['l2_bytes'] / 1e9:.2f} GB, DRAM read "
                  f"{r['dram_read_bytes'] / 1e9:.2f} GB")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
