"""The CPU decode kernel (``schedules/attention_cpu_decode.py``) with its rows in pairs, timed here, kernels alone
(float32, built by ``tvm.compile`` for this CPU, ``time_evaluator`` means of 10 calls, interleaved rounds, each round
in the other order; medians):

    python benchmarks/results/rerun/attention-cpu-decode-pairs/pairs.py ab REV     # -> ab.json: vs REV's kernel
    python benchmarks/results/rerun/attention-cpu-decode-pairs/pairs.py cross      # -> cross.json: vs the main kernel

``ab``: the working tree's decode kernel against REV's (dd01b8c: one row at a time) on the attention benchmark's
decoding steps and 2 rows per head. ``cross``: the decode kernel against the main one (``attention_cpu``) at 4, 8, 12
query rows per head: where ``MAX_SEQ_Q`` lies.
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
sys.path.insert(0, str(REPO))
import numpy as np  # noqa: E402
import tvm  # noqa: E402

from compiler import targets  # noqa: E402
from schedules import attention_cpu, attention_cpu_decode  # noqa: E402
from schedules.attention import AttentionSpec  # noqa: E402

TARGET = targets.resolve("cpu").target
ROUNDS = 11
GQA, MHA = (1, 2048, 32, 8, 128), (4, 1024, 16, 16, 64)  # (batch, keys, heads, K/V heads, head dim)


def timed(kernels: dict, shape: tuple) -> dict:
    """Median ms of each kernel builder on ``shape`` (batch, query rows, keys, heads, K/V heads, head dim), and its
    error against float64."""
    b, s, skv, h, hkv, d = shape
    spec = AttentionSpec(b, s, skv, h, hkv, d, d, "float32", d ** -0.5, "none", None, None)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(x).astype(np.float32) for x in ((b, s, h, d), (b, skv, hkv, d), (b, skv, hkv, d)))
    kk, vv = (np.repeat(x, h // hkv, 2).astype(np.float64) for x in (k, v))
    sc = np.einsum("bihd,bjhd->bhij", q.astype(np.float64), kk) * d ** -0.5
    p = np.exp(sc - sc.max(-1, keepdims=True))
    ref = np.einsum("bhij,bjhd->bihd", p / p.sum(-1, keepdims=True), vv)
    runs = {}
    for name, kernel in kernels.items():
        with TARGET:
            lib = tvm.compile(tvm.IRModule({"main": kernel(spec, TARGET).with_attr("global_symbol", "main")}), TARGET)
        args = [tvm.runtime.tensor(x) for x in (q, k, v, np.zeros_like(q))]
        lib["main"](*args)
        err = float(np.linalg.norm(args[-1].numpy() - ref) / np.linalg.norm(ref))
        runs[name] = (lib.mod.time_evaluator("main", tvm.cpu(), number=10, repeat=1), args, err)
    times = {name: [] for name in runs}
    for r in range(ROUNDS):
        for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
            time.sleep(0.05)
            times[name].append(runs[name][0](*runs[name][1]).mean * 1e3)
    return {name: {"ms": float(np.median(t)), "ms_rounds": t, "rel_err": runs[name][2]} for name, t in times.items()}


def main() -> None:
    mode = sys.argv[1]
    if mode == "ab":
        rev = sys.argv[2]
        # (kept until the end: TVMScript reads a kernel's source from its file when the kernel is built)
        path = Path(tempfile.mkdtemp()) / "before.py"
        path.write_text(subprocess.run(["git", "show", f"{rev}:schedules/attention_cpu_decode.py"], cwd=REPO,
                                       capture_output=True, text=True, check=True).stdout)
        spec = importlib.util.spec_from_file_location("schedules._before_decode", path)
        before = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(before)
        kernels = {"pairs": attention_cpu_decode.kernel, "before": before.kernel}
        shapes = [(GQA[0], 1, *GQA[1:]), (GQA[0], 2, *GQA[1:]), (GQA[0], 4, *GQA[1:]), (MHA[0], 1, *MHA[1:])]
    else:
        kernels = {"decode": attention_cpu_decode.kernel, "main": attention_cpu.kernel}
        shapes = [(c[0], s, *c[1:]) for c in (GQA, MHA) for s in (4, 8, 12)]
    records = []
    for shape in shapes:
        res = timed(kernels, shape)
        a, b = list(res)
        records.append({"shape": dict(zip(("batch", "seq_q", "seq_kv", "heads", "kv_heads", "d"), shape)),
                        "load_avg": list(os.getloadavg()), f"{a}_vs_{b}": res[b]["ms"] / res[a]["ms"], **res})
        print(shape, {n: round(r["ms"], 4) for n, r in res.items()}, f"{a} vs {b}: {res[b]['ms'] / res[a]['ms']:.2f}x",
              flush=True)
    (HERE / f"{mode}.json").write_text(json.dumps({"cpu": targets.resolve("cpu").isa_summary(), "rounds": ROUNDS,
                                                   "before": sys.argv[2] if mode == "ab" else None, "records": records},
                                                  indent=1))


if __name__ == "__main__":
    main()
