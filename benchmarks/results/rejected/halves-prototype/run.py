"""Device: the half-rows prototype against the rule's stamped kernel and a memcpy, float16 128 x 131072.

Reproduce (the experiment of commit 1d3e5cc): in this folder, ``nvcc -arch=sm_90a -cubin -O3 -DB_AFTER=B -o
NAME.cubin halves.cu`` for the three issue orders (NAME, B: halves 0, halves3 1, halves2 2); the rule's stamped
kernel from ``benchmarks/softmax_phases.py --build`` copied here as ``rule.cubin``
(``build/gpu/softmax-phases/float16_128x131072.cubin``); then on the GPU machine (CuPy)
``python run.py OUT_DIR NAME.cubin``."""
import json, os, random, sys
import cupy as cp
import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
rows, cols = 128, 131072
x = (cp.random.standard_normal((rows, cols), dtype=cp.float32) * 4).astype(cp.float16)
xf = x.astype(cp.float64)
ref = cp.exp(xf - xf.max(axis=1, keepdims=True)); ref /= ref.sum(axis=1, keepdims=True)
proto = cp.RawModule(path=f"{here}/{sys.argv[2]}").get_function("halves")
proto.max_dynamic_shared_size_bytes = 196608
rule = cp.RawModule(path=f"{here}/rule.cubin").get_function("func_kernel")
rule.max_dynamic_shared_size_bytes = 196944
y1, y2, z = cp.empty_like(x), cp.empty_like(x), cp.empty_like(x)
s1, s2 = cp.zeros((128, 6), cp.uint64), cp.zeros((128, 5), cp.uint64)
runs = {
    "proto": lambda: proto((128,), (1024,), (x, y1, s1), shared_mem=196608),
    "rule": lambda: rule((128,), (1024,), (x, y2, s2), shared_mem=196944),
    "copy": lambda: cp.cuda.runtime.memcpyAsync(z.data.ptr, x.data.ptr, x.nbytes, cp.cuda.runtime.memcpyDeviceToDevice,
                                                cp.cuda.get_current_stream().ptr),
}
out = {}
for name in ("proto", "rule"):
    runs[name]()
    y = y1 if name == "proto" else y2
    cp.cuda.Device().synchronize()
    out[f"{name}_max_err"] = float(cp.abs(y.astype(cp.float64) - ref).max())
print(out, flush=True)
ph = []
for _ in range(16):
    runs["proto"](); cp.cuda.Device().synchronize()
    s = s1.get().astype(np.int64)
    t = (s[:, :5] - s[:, 0].min()) / 1e3
    ph.append([np.median(t[:, i]) for i in range(5)] + [t[:, i].max() for i in range(5)])
ph = np.median(np.array(ph), axis=0)
out["proto_phases_median"] = dict(zip(["start", "A_merged", "A_written", "B_merged", "end"], np.round(ph[:5], 3).tolist()))
out["proto_phases_last"] = dict(zip(["start", "A_merged", "A_written", "B_merged", "end"], np.round(ph[5:], 3).tolist()))
e0, e1 = cp.cuda.Event(), cp.cuda.Event()
times = {k: [] for k in runs}
for r in range(10):
    order = list(runs); random.Random(r).shuffle(order)
    for name in order:
        runs[name]()
        e0.record()
        for _ in range(20):
            runs[name]()
        e1.record(); e1.synchronize()
        times[name].append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / 20)
for k, v in times.items():
    out[f"{k}_us"] = float(np.median(v))
out["proto_of_copy"] = out["copy_us"] / out["proto_us"]
out["rule_of_copy"] = out["copy_us"] / out["rule_us"]
out["times"] = times
print(json.dumps({k: v for k, v in out.items() if k != "times"}, indent=1))
json.dump(out, open(f"{sys.argv[1]}/proto-{sys.argv[2]}.json", "w"), indent=1)
