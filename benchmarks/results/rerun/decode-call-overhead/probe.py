"""Where a decode step's per-call time goes beside its two kernels (issue #5: at one query row per K/V head our
kernels take what cuDNN's take, yet a call took 14.9 us against torch's graph 10.7 on the H100).

Each way of calling the default package of ``benchmarks/attention_decode.py`` (built there with ``--build``), timed
per call between two CUDA events like torch's graph, plus the host's time per call with nothing synchronised (2000
calls back to back: the host's issue cost when it is the bottleneck), plus one torch-profiler timeline (host API calls
and GPU kernels of 5 calls):

- ``evaluator``: ``Runner.time`` (TVM's time_evaluator over ``invoke_stateful``, what the benchmark reports)
- ``vm``: the VM's ``main`` called from Python on inputs already on the device (``Runner.bound``)
- ``primfunc``: the ``attention`` host function alone (its two launches, the VM skipped), output allocated once
- ``vm-in-graph`` / ``primfunc-in-graph``: the same captured in a CUDA graph (``tvm_ffi.use_torch_stream``), replayed
- ``capture`` / ``capture-time``: ``Runner.capture``'s graph replayed (timed by cuda_ms / by its own ``time``)
- ``torch-graph``: torch's SDPA replayed from a graph; ``empty``: the two events alone; ``ffi-noop``: an FFI call

    python3 benchmarks/results/rerun/decode-call-overhead/probe.py --out DIR    # GPU machine, after --build here
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
CASES = ("gqa", "gqa_b8", "mha")
REPEAT, ROUNDS, HOST_CALLS = 200, 5, 2000


def main() -> None:
    import torch
    import torch.nn.functional as F
    import tvm
    import tvm_ffi

    from benchmarks.attention_decode import BUILD, CASES as SHAPES
    from benchmarks.common import cuda_ms, gpu_slug
    from compiler import package
    from compiler.runtime import load

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    out = ap.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    records = []

    def host_us(fn) -> float:
        """Host microseconds per call, HOST_CALLS calls with no synchronisation between them."""
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(HOST_CALLS):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / HOST_CALLS * 1e6

    def in_graph(fn):
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        try:
            with tvm_ffi.use_torch_stream(torch.cuda.graph(g)):
                kept = fn()  # the captured call's outputs: their memory is the graph's
        except Exception as err:  # noqa: BLE001 (printed: the rest is still measured)
            print(f"capture in torch's graph failed: {err!r}", flush=True)
            return None
        g.kept = kept
        return g.replay

    for name in CASES:
        b, s, skv, h, hkv, d = SHAPES[name]
        path = str(BUILD / f"{name}.tvmpkg")
        runner = load(path)
        with tempfile.TemporaryDirectory() as tmp:
            lib = tvm.runtime.load_module(str(package.extract_library(path, tmp)))
        prim = lib.get_function("attention", query_imports=True)
        rng = np.random.default_rng(0)
        x = {"q": rng.standard_normal((b, s, h * d)), "k": rng.standard_normal((b, skv, hkv * d)),
             "v": rng.standard_normal((b, skv, hkv * d))}
        x = {n: a.astype(np.float16) for n, a in x.items()}
        want = runner(**x)["y"]
        dev = tvm.cuda(0)
        heads = {"q": h, "k": hkv, "v": hkv}
        # the host function's parameters: q, k, v as [b, rows, heads, d], the output as [b, s, h * d]
        args = [tvm.runtime.tensor(x[n].reshape(b, -1, heads[n], d), dev) for n in "qkv"]
        y = tvm.runtime.empty((b, s, h * d), "float16", dev)
        prim(*args, y)
        prim_ok = bool(np.array_equal(y.numpy(), want))
        vm = runner.bound(x)
        q, k, v = (torch.from_numpy(x[n]).cuda().view(b, -1, heads[n], d).transpose(1, 2) for n in "qkv")
        sdpa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
        sdpa()
        torch.cuda.synchronize()
        tg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(tg):
            sdpa()
        noop = tvm_ffi.get_global_func("ffi.String", allow_missing=True)
        fresh = {n: rng.standard_normal(a.shape).astype(np.float16) for n, a in x.items()}
        try:
            graph = runner.capture(x)  # Runner.capture: main recorded into a CUDA graph of its own
            checks = {"capture_matches": bool(np.array_equal(graph(**x)["y"], want)),
                      "capture_new_inputs_match": bool(np.array_equal(graph(**fresh)["y"], runner(**fresh)["y"])),
                      "capture_partial_update_matches": bool(np.array_equal(graph(q=x["q"])["y"],
                                                                            runner(**{**fresh, "q": x["q"]})["y"]))}
        except Exception as err:  # noqa: BLE001 (recorded: the rest is still measured)
            graph, checks = None, {"capture_error": repr(err)}
        turns = {"empty": lambda: None, "vm": vm, "torch-graph": tg.replay, "vm-in-graph": in_graph(vm),
                 **({"capture": graph.replay} if graph else {})}
        if prim_ok:
            turns["primfunc"] = lambda: prim(*args, y)
            turns["primfunc-in-graph"] = in_graph(lambda: prim(*args, y))
        turns = {t: fn for t, fn in turns.items() if fn is not None}
        ms: dict[str, list[float]] = {t: [] for t in [*turns, "evaluator", "capture-time"]}
        for r in range(ROUNDS):
            for t, fn in turns.items():
                ms[t] += cuda_ms(fn, repeat=REPEAT // ROUNDS, warmup=3)
            ms["evaluator"] += runner.time(x, repeat=REPEAT // ROUNDS, warmup=3).ms
            if graph:
                ms["capture-time"] += graph.time(repeat=REPEAT // ROUNDS, warmup=3).ms
        rec = {"case": name, "device": torch.cuda.get_device_name(0), "primfunc_matches": prim_ok, **checks,
               "us": {t: float(np.median(v)) * 1e3 for t, v in ms.items() if v},
               "host_us": {t: host_us(fn) for t, fn in turns.items() if t != "empty"}}
        if noop is not None:
            rec["host_us"]["ffi-noop"] = host_us(lambda: noop("x"))
        # one timeline: host API calls and GPU kernels of 5 calls of the VM, then of the graph
        from torch.profiler import ProfilerActivity, profile
        for label, fn in (("vm", vm), ("primfunc", turns.get("primfunc")), ("torch-graph", tg.replay)):
            if fn is None:
                continue
            fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    fn()
                torch.cuda.synchronize()
            evs = sorted(prof.events(), key=lambda e: e.time_range.start)
            t0 = evs[0].time_range.start if evs else 0
            rec[f"timeline_{label}"] = [(e.name[:60], str(e.device_type).split(".")[-1], round(e.time_range.start - t0, 2),
                                         round(e.time_range.elapsed_us(), 2)) for e in evs[:120]]
        print(json.dumps({k: v for k, v in rec.items() if not k.startswith("timeline")}), flush=True)
        records.append(rec)
        (out / f"decode-call-overhead-{gpu_slug()}.json").write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
