"""Device: a softmax followed by a kernel that reads its output (y.max(), like a sampler's pass), plain against
evict-first output stores; each pair timed back to back (20 pairs), rounds in random order.

Reproduce (the experiment of commit 2e2217d): ``benchmarks/softmax_phases.py --build`` at that commit into
``build/gpu/softmax-phases`` and at its parent into ``build/gpu/softmax-phases-base``; this script in ``build/proto/``;
then on the GPU machine (CuPy) ``python build/proto/consumer.py OUT_DIR``."""
import json, os, random, sys
import cupy as cp
import numpy as np

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu")
out = {}
for name in ("float16_128x131072", "float32_128x131072", "float16_16x1048576", "float32_16x1048576"):
    runs = {}
    for tag, d in (("plain", "softmax-phases-base"), ("evict_first", "softmax-phases")):
        case = [c for c in json.load(open(f"{root}/{d}/manifest.json")) if c["name"] == name][0]
        k = cp.RawModule(path=f"{root}/{d}/{name}.cubin").get_function("func_kernel")
        k.max_dynamic_shared_size_bytes = case["smem"]
        x = (cp.random.standard_normal((case["rows"], case["cols"]), dtype=cp.float32) * 4).astype(case["dtype"])
        y = cp.empty_like(x)
        st = cp.zeros((case["grid"], 5), cp.uint64)
        runs[tag] = (lambda k=k, x=x, y=y, st=st, c=case: k((c["grid"],), (c["block"],), (x, y, st), shared_mem=c["smem"]))
        runs[tag + "+read"] = (lambda f=runs[tag], y=y: (f(), y.max()))
        runs["read " + tag] = (lambda y=y: y.max())
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    t = {k: [] for k in runs}
    for r in range(10):
        order = list(runs); random.Random(r).shuffle(order)
        for n in order:
            runs[n]()
            e0.record()
            for _ in range(20):
                runs[n]()
            e1.record(); e1.synchronize()
            t[n].append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / 20)
    out[name] = {k: float(np.median(v)) for k, v in t.items()}
    print(name, {k: round(v, 2) for k, v in out[name].items()}, flush=True)
json.dump(out, open(f"{sys.argv[1]}/consumer.json", "w"), indent=1)
