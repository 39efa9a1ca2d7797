"""ONNX backend *node* tests through tvmpipe: compile + run every one that ships with ``onnx``, compare.

    python benchmarks/onnx_conformance.py                  # all ~1900 tests -> benchmarks/results/onnx_conformance.json
    python benchmarks/onnx_conformance.py --filter 'resize' --out /tmp/r.json -v

Each test is written to disk (model.onnx) and compiled for the ``cpu`` target with the pipeline's own
``compile_model`` (input shapes bound from the test data), loaded with ``compiler.runtime.load`` and run;
outputs are compared at rtol 1e-3 / atol 1e-4 with NaN == NaN (one-byte float8/float4/int4 types exactly),
equal shapes and dtypes. Tests run in a
small pool of persistent worker processes (TVM is imported once per worker, not per test); a worker
that hangs past the timeout or crashes is killed and replaced, and the test is recorded as run_fail.

A test refused because a graph input's run-time value decides a shape (Reshape's shape, TopK's k ...) is
compiled again with exactly the inputs the refusal names frozen to the test's own values (``--bind-input``),
then run on all its inputs (the runtime checks the bound ones are fed unchanged) and checked as any other;
its record carries ``bound_inputs``, and the summary counts those passes apart from the rest (``--no-bind``
skips the retry).

Statuses: pass; unsupported (tvmpipe refused it with a clear error: no converter, a known-wrong case,
an input that must be constant ...); import_fail (any other frontend error); compile_fail (a failure
after import: a bug); run_fail (runtime error, crash or timeout); mismatch (a WRONG answer: must be 0).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path

import ml_dtypes
import numpy as np

REPO = Path(__file__).resolve().parent.parent
RTOL, ATOL = 1e-3, 1e-4


@dataclass
class Case:
    name: str
    op: str
    model: bytes
    inputs: list  # arrays in graph-input order (None for an omitted optional input)
    outputs: list  # expected arrays in graph-output order


def _array(value):
    """Test data comes as numpy arrays, or as TensorProtos for the dtypes numpy lacks (float8, int4 ...)."""
    import onnx

    return onnx.numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value


def load_cases(pattern: str | None) -> list[Case]:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators' own overflow warnings
        tests = load_model_tests(kind="node")
    rx = re.compile(pattern) if pattern else None
    cases = []
    for t in tests:
        if rx and not rx.search(t.name):
            continue
        ins, outs = (list(map(_array, arrays)) for arrays in t.data_sets[0])
        cases.append(Case(t.name, t.model.graph.node[0].op_type, t.model.SerializeToString(), ins, outs))
    return cases


def _first_line(err: BaseException) -> str:
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"[:500]


def _compare(ours: np.ndarray, ref) -> str | None:
    """None if equal within tolerance, else what differs."""
    ref = np.asarray(ref)
    if ours.shape != ref.shape:
        return f"shape {list(ours.shape)}, expected {list(ref.shape)}"
    if ours.dtype != ref.dtype:
        return f"dtype {ours.dtype}, expected {ref.dtype}"
    if ref.dtype.kind in "biuSUO":
        ok = ours == ref
    elif ref.dtype.itemsize == 1:  # float8/float4/int4/int2 (ml_dtypes): exactly, NaN == NaN
        a, b = ours.astype(np.float64), ref.astype(np.float64)
        ok = (a == b) | (np.isnan(a) & np.isnan(b))
    else:  # float16/32/64 and bfloat16 (ml_dtypes)
        # A 16-bit result may legitimately differ from the reference by rounding order (fused kernels round
        # once, the reference after every op): allow 2 units of its last place where that exceeds RTOL.
        rtol = max(RTOL, 2 * float(ml_dtypes.finfo(ref.dtype).eps))
        ok = np.isclose(ours.astype(np.float64), ref.astype(np.float64), rtol=rtol, atol=ATOL, equal_nan=True)
    if np.all(ok):
        return None
    bad = np.argwhere(~np.asarray(ok))
    i = tuple(bad[0])
    return f"{len(bad)}/{ref.size} elements differ, e.g. at {list(i)}: {ours[i]!r} vs {ref[i]!r}"


def run_case(case: Case, workdir: str, bind: bool = True) -> dict:
    """Compile, run and check one test in this (worker) process; return its record. ``bind``: retry a test
    refused for a run-time shape value with the graph inputs the refusal names bound to the test's values."""
    import onnx

    from compiler.errors import TvmpipeError
    from compiler.frontend.support import Unsupported
    from compiler.pipeline import compile_model
    from compiler.runtime import load

    rec = {"test": case.name, "op": case.op, "status": "pass", "error": None}
    model = onnx.ModelProto.FromString(case.model)
    src, pkg = Path(workdir) / "model.onnx", Path(workdir) / "model.tvmpkg"
    src.write_bytes(case.model)
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    feeds = {n: a for n, a in zip(names, case.inputs) if a is not None}
    shapes = {n: tuple(np.shape(a)) for n, a in feeds.items() if isinstance(a, np.ndarray)}
    def failed(status: str, error: str) -> dict:
        return {**rec, "status": status, "error": error.replace(f"{workdir}/", "")}  # reproducible text

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                compile_model(src, "cpu", pkg, shapes)
            except Unsupported as err:
                tensors = (np.ndarray, np.generic)  # a scalar input's data may come as a numpy scalar
                if not (bind and err.bindable and all(isinstance(feeds.get(n), tensors) for n in err.bindable)):
                    raise
                rec["bound_inputs"] = list(err.bindable)
                free = {n: s for n, s in shapes.items() if n not in err.bindable}
                compile_model(src, "cpu", pkg, free, bind={n: np.asarray(feeds[n]) for n in err.bindable})
    except Unsupported as err:
        return failed("unsupported", str(err))
    except Exception as err:  # noqa: BLE001 - classify every failure
        frames = traceback.extract_tb(err.__traceback__)
        in_frontend = isinstance(err, TvmpipeError) or any("compiler/frontend" in f.filename for f in frames)
        return failed("import_fail" if in_frontend else "compile_fail", _first_line(err))
    try:
        runner = load(str(pkg))
        got = runner(**feeds)
    except Exception as err:  # noqa: BLE001
        return failed("run_fail", _first_line(err))
    problems = []
    for spec, ref in zip(model.graph.output, case.outputs):
        diff = _compare(np.asarray(got[spec.name]), ref)
        if diff:
            problems.append(f"output '{spec.name}': {diff}")
    if problems:
        return {**rec, "status": "mismatch", "error": "; ".join(problems)[:1000]}
    return rec


def _worker(conn, bind: bool) -> None:
    """Serve cases from ``conn`` until told to stop (None)."""
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("TVM_NUM_THREADS", "1")
    while True:
        case = conn.recv()
        if case is None:
            return
        with tempfile.TemporaryDirectory(prefix="conf-") as tmp:
            try:
                rec = run_case(case, tmp, bind)
            except BaseException as err:  # noqa: BLE001 - never lose the worker's answer
                rec = {"test": case.name, "op": case.op, "status": "run_fail", "error": _first_line(err)}
        conn.send(rec)


class Pool:
    """Persistent worker processes, one case each at a time; a worker past its deadline is killed.

    ``multiprocessing.Pool`` cannot kill one hung task, hence this small pool of pipes.
    """

    def __init__(self, n: int, timeout: float, max_tasks: int, bind: bool = True):
        self.ctx = mp.get_context("spawn")
        self.n, self.timeout, self.max_tasks, self.bind = n, timeout, max_tasks, bind
        self.slots: list[dict] = []

    def _start(self) -> dict:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child, self.bind), daemon=True)
        proc.start()
        child.close()
        return {"proc": proc, "conn": parent, "case": None, "deadline": 0.0, "done": 0}

    def _stop(self, slot: dict, kill: bool) -> None:
        if kill:
            slot["proc"].kill()
        else:
            slot["conn"].send(None)
        slot["proc"].join()
        slot["conn"].close()

    def run(self, cases: list[Case], on_result) -> None:
        todo = list(reversed(cases))
        self.slots = [self._start() for _ in range(min(self.n, len(cases)))]
        while todo or any(s["case"] for s in self.slots):
            for k, slot in enumerate(self.slots):
                if slot["case"] is None and todo:
                    if slot["done"] >= self.max_tasks:
                        self._stop(slot, kill=False)
                        slot = self.slots[k] = self._start()
                    slot["case"] = todo.pop()
                    slot["deadline"] = time.monotonic() + self.timeout
                    slot["conn"].send(slot["case"])
            busy = [s for s in self.slots if s["case"]]
            ready = wait([s["conn"] for s in busy] + [s["proc"].sentinel for s in busy], timeout=1.0)
            for k, slot in enumerate(self.slots):
                case = slot["case"]
                if case is None:
                    continue
                if slot["conn"] in ready:
                    try:
                        rec = slot["conn"].recv()
                    except EOFError:
                        rec = None
                    if rec is not None:
                        slot["case"], slot["done"] = None, slot["done"] + 1
                        on_result(rec)
                        continue
                if slot["proc"].sentinel in ready or time.monotonic() > slot["deadline"]:
                    dead = not slot["proc"].is_alive()
                    why = f"worker crashed (exit code {slot['proc'].exitcode})" if dead else f"timeout after {self.timeout:.0f} s"
                    self._stop(slot, kill=True)
                    self.slots[k] = self._start()
                    on_result({"test": case.name, "op": case.op, "status": "run_fail", "error": why})
        for slot in self.slots:
            self._stop(slot, kill=False)


# Why a test does not pass, from its error message: (category, regex), first match wins.
CATEGORIES = [
    ("training mode (not an inference computation)", r"training_mode"),
    ("needs a run-time value at compile time (static shapes)", r"must be a constant|must be known at compile time|"
                                                              r"is computed at run time"),
    ("element type not computed exactly (float8/4, int4/2, string)", r"element types? .*cannot|element type"),
    ("data-dependent output shape", r"data-dependent shape"),
    ("sequence / optional / map values", r"is not a tensor"),
    ("op feature refused (an attribute, output or mode not computed exactly)",
     r"Relax converter|is not an inference computation|not supported"),
    ("no converter", r"no converter"),
]


def category(rec: dict) -> str:
    if rec["status"] != "unsupported":
        return rec["status"] if rec["status"] != "import_fail" else f"import_fail: {rec['op']}"
    for name, rx in CATEGORIES:
        if re.search(rx, rec["error"] or ""):
            if name == "no converter":
                ops = re.findall(r"(\S+) \(opset \d+; nodes? [^)]*\): no converter", rec["error"])
                return f"no converter: {', '.join(sorted(set(ops)))}"
            return name
    return "unsupported: other"


def summarize(records: list[dict], seconds: float) -> dict:
    """Counts by status and by reason; passes with and without bound inputs apart (both are reported)."""
    status = Counter(r["status"] for r in records)
    reasons = Counter(category(r) for r in records if r["status"] != "pass")
    n = max(len(records), 1)
    with_bound = sum(r["status"] == "pass" and bool(r.get("bound_inputs")) for r in records)
    return {
        "tests": len(records),
        "passed": status["pass"],
        "pass_rate": round(status["pass"] / n, 4),
        "passed_without_binding": status["pass"] - with_bound,
        "pass_rate_without_binding": round((status["pass"] - with_bound) / n, 4),
        "passed_with_bound_inputs": with_bound,
        "retried_with_bound_inputs": sum(bool(r.get("bound_inputs")) for r in records),
        "by_status": dict(status.most_common()),
        "by_category": dict(reasons.most_common()),
        "seconds": round(seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--filter", help="only tests whose name matches this regex")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per test before its worker is killed")
    p.add_argument("--max-tasks", type=int, default=100, help="tests per worker before it is replaced")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "onnx_conformance.json"))
    p.add_argument("-v", "--verbose", action="store_true", help="print every non-passing test")
    p.add_argument("--no-bind", action="store_true",
                   help="do not retry tests refused for a run-time shape value with those inputs bound")
    args = p.parse_args(argv)

    cases = load_cases(args.filter)
    records: list[dict] = []
    t0 = time.monotonic()

    def on_result(rec: dict) -> None:
        records.append(rec)
        if args.verbose and rec["status"] != "pass":
            print(f"{rec['status']:<12} {rec['test']}: {rec['error']}", flush=True)
        elif len(records) % 100 == 0:
            print(f"{len(records)}/{len(cases)} done, {time.monotonic() - t0:.0f} s", flush=True)

    Pool(args.workers, args.timeout, args.max_tasks, bind=not args.no_bind).run(cases, on_result)
    records.sort(key=lambda r: r["test"])
    summary = summarize(records, time.monotonic() - t0)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=1) + "\n")
    out.with_name(out.stem + "_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "by_category"}))
    return 1 if summary["by_status"].get("mismatch") else 0


if __name__ == "__main__":
    sys.exit(main())
