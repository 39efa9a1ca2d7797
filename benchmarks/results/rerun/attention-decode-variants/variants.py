"""Decode kernel (``schedules/attention_cuda_decode.py``) constants A/B on the benchmark's shapes (``attention_decode.py``
CASES; build that first, here):

    python benchmarks/results/rerun/attention-decode-variants/variants.py build     # here -> build/gpu/decode/var/
    python3 .../variants.py run DIR                                                  # GPU machine: DIR/var.json
    python3 .../variants.py prof DIR                                                 # GPU machine with ncu: DIR/prof.json

Each variant patches module constants before compiling. "ms": median of 5 interleaved rounds of the median of 100
calls (one call between timer events, as the benchmark); "ms_burst": 20 calls back to back, mean (launch overheads
overlapped); "maxdiff": against the first variant.

- run1 (commit 8a20843's first form, ``STAGES = 0``: loads straight into registers; ``WAVES = 4``): rNlM = a ring of
  N steps (0: registers) and M loads per lane per step; w2 / w8 = WAVES; VARS were r0l8 r0l4 r3l4 r4l4 r6l2 r3l8
  r3l4w2 r3l4w8 r4l2.
- run2 (8a20843 with ``LOADS = 4, STAGES = 3``, plus a ``MIN_BLOCKS`` launch-bounds option never committed: mN caps
  the registers for N CTAs per SM, which spilled 112-272 bytes): the VARS below as they were then; ncu-run2 profiles
  r3l4 (its stalls: warps eligible but not selected, the FMA pipes half busy: issue-bound) and torch's cuDNN kernel.
- run3: ``LAZY`` (the running output rescaled only when a row's max moves), then an option of the kernel, against
  it without (the VARS below; the kernel has since taken it as its only form, so they no longer build).
"""
import sys, json
from pathlib import Path
from unittest import mock
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository
import numpy as np
ROOT = Path(__file__).resolve().parents[4]
D = ROOT / "build" / "gpu" / "decode" / "var"
VARS = {"base": {"LAZY": False}, "lazy": {"LAZY": True}}
CASES = ["gqa", "gqa_32k", "gqa_b8", "mha", "gqa_b8_rows4"]
if sys.argv[1] == "build":
    from compiler import compile_model
    from schedules import attention_cuda_decode as m
    D.mkdir(parents=True, exist_ok=True)
    for v, consts in VARS.items():
        for c in CASES:
            with mock.patch.multiple(m, **consts):
                compile_model(D.parent / f"{c}.onnx", "cuda-sm90", D / f"{c}-{v}.tvmpkg")
        print(v, flush=True)
elif sys.argv[1] in ("launch", "torch"):
    import torch
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from attention_decode import CASES as SHAPES
    b, s, skv, h, hkv, d = SHAPES[sys.argv[2]]
    rng = np.random.default_rng(0)
    x = {"q": rng.standard_normal((b, s, h * d)), "k": rng.standard_normal((b, skv, hkv * d)), "v": rng.standard_normal((b, skv, hkv * d))}
    x = {n: a.astype(np.float16) for n, a in x.items()}
    if sys.argv[1] == "launch":
        from compiler.runtime import load
        r = load(str(D / f"{sys.argv[2]}-{sys.argv[3]}.tvmpkg"))
        r.time(x, repeat=3, warmup=1)
    else:
        import torch.nn.functional as F
        heads = {"q": h, "k": hkv, "v": hkv}
        q, k, v = (torch.from_numpy(x[n]).cuda().view(b, -1, heads[n], d).transpose(1, 2) for n in "qkv")
        for _ in range(3):
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        torch.cuda.synchronize()
elif sys.argv[1] == "prof":
    sys.path.insert(0, str(ROOT))
    from benchmarks.common import ncu_profile, ncu_line
    res = {}
    for c, v in [("gqa_b8", "r3l4"), ("gqa_b8_rows4", "r3l4")]:
        recs = ncu_profile("regex:attention", [__file__, "launch", c, v])
        res[f"{c}/{v}"] = recs[-2:]
        for r in recs[-2:]:
            print(c, v, r["kernel"][:40], ncu_line(r), r["stalls"], flush=True)
    for c in ("gqa_b8",):
        recs = ncu_profile("regex:.", [__file__, "torch", c])
        res[f"{c}/torch"] = recs[-3:]
        for r in recs[-3:]:
            print(c, "torch", r["kernel"][:60], ncu_line(r), r["stalls"], flush=True)
    out = Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
    (out / "prof.json").write_text(json.dumps(res, indent=1))
else:
    import torch
    from compiler.runtime import load
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from attention_decode import CASES as SHAPES
    res = {}
    for c in CASES:
        b, s, skv, h, hkv, d = SHAPES[c]
        rng = np.random.default_rng(0)
        x = {"q": rng.standard_normal((b, s, h * d)), "k": rng.standard_normal((b, skv, hkv * d)), "v": rng.standard_normal((b, skv, hkv * d))}
        x = {n: a.astype(np.float16) for n, a in x.items()}
        runners = {v: load(str(D / f"{c}-{v}.tvmpkg")) for v in VARS}
        ref = np.asarray(runners["base"](**x)["y"], np.float32)
        t = {v: [] for v in VARS}
        for rnd in range(5):
            for v, r in runners.items():
                t[v].append(float(np.median(r.time(x, repeat=100, warmup=10).ms)))
        for v, r in runners.items():
            out = np.asarray(r(**x)["y"], np.float32)
            r._vm.set_input("main", *r._arguments(x))
            burst = r._vm.time_evaluator("invoke_stateful", r.device, number=20, repeat=10)("main").results
            res[f"{c}/{v}"] = {"ms": float(np.median(t[v])), "ms_burst": float(np.median(burst)) * 1e3,
                               "maxdiff": float(np.abs(out - ref).max())}
            print(c, v, res[f"{c}/{v}"], flush=True)
    out = Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
    (out / "var.json").write_text(json.dumps(res, indent=1))
