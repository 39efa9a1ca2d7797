"""Nsight Compute side by side: tvmpipe's attention kernel against torch SDPA's cuDNN and flash kernels (issue #5),
on the benchmark shapes furthest behind cuDNN (seq 512, d128 and d64 causal at seq 2048), to say where the gap is.

    python3 benchmarks/attention.py --build                  # here: the benchmark's library, whose rule kernels this runs
    python3 benchmarks/attention_profile.py --run --out DIR  # GPU machine with ncu: DIR/attention-ncu-<gpu>.json

``--run`` profiles each implementation in its own process (``ncu`` over ``--launch IMPL``, three calls per shape,
the last one kept; the figures kept: ``benchmarks.common.ncu_profile``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.attention import CASES, LIB  # noqa: E402
from benchmarks.common import gpu_slug, ncu_line, ncu_profile  # noqa: E402

PROFILED = [c for c in CASES if c.name in ("bench_d128_s512_full", "bench_d128_s512_causal", "bench_d64_s512_full",
                                           "bench_d64_s512_causal", "bench_d128_s2048_full", "bench_d64_s2048_causal")]
IMPLS = {"tvmpipe": "regex:bench_", "torch-cudnn": "regex:cudnn", "torch-flash": "regex:flash_fwd"}


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
                    F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=bool(case.causal))
        torch.cuda.synchronize()


def profile(impl: str) -> list[dict]:
    """ncu over ``launch(impl)``: the last of each shape's three calls."""
    launches = ncu_profile(IMPLS[impl], [__file__, "--launch", impl])
    assert len(launches) == 3 * len(PROFILED), f"{impl}: {len(launches)} kernels profiled"
    return [{"impl": impl, "d": case.head_dim, "seq": case.seq_q, "batch": case.batch, "heads": case.heads,
             "causal": bool(case.causal), **got} for case, got in zip(PROFILED, launches[2::3])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--run", action="store_true", help="profile them and torch's beside them (GPU machine, ncu)")
    mode.add_argument("--launch", choices=IMPLS, help="(what --run profiles)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args(argv)
    if args.launch:
        launch(args.launch)
    else:
        device = gpu_slug()
        records = [r | {"device": device} for impl in IMPLS for r in profile(impl)]
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"attention-ncu-{device}.json"
        path.write_text(json.dumps(records, indent=1))
        for r in records:
            print(f"{r['impl']:>12} d{r['d']} s{r['seq']}{' causal' if r['causal'] else '':7}: {ncu_line(r)}")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
