#!/usr/bin/env python3
"""Model zoo, end to end: tvmpipe against what users would otherwise run, side by side in one process.

ResNet-50, MobileNetV2, ViT-B/16 (torchvision), BERT-base seq 128 and GPT-2-small prefill seq 256
(transformers) are built with seeded random weights, exported to ONNX (cached in build/zoo/, never
committed), compiled with tvmpipe and checked and timed:

  cpu        vs onnxruntime with the same thread count, batch 1, fp32 (reference: onnxruntime)
  cuda-sm90  vs PyTorch eager and torch.compile, batch 1 and 32, fp32 and fp16 (reference: the same
             torch module in float64 on the GPU)

  python benchmarks/models.py --target cpu                   # here -> results/models-<machine>.json
  python3 benchmarks/models.py --target cuda-sm90 --out DIR  # on the GPU machine (torch + TVM compiler)
  python3 benchmarks/models.py --target cuda-sm90 --variants gpt2:32:fp16 bert_base:1:fp32 --out DIR
  python3 benchmarks/models.py --target cuda-sm90 --stale --models gpt2 --out DIR  # rows of older code
  python benchmarks/models.py --report                       # results/*.json -> RESULTS.md, PNG, README

Each row records a digest of the compiler's sources ("code") and of the compiled library it timed ("build");
the report names the rows measured with other code than the checkout's, which --variants or --stale can then
re-measure. A second run of the same code,
merged into results/rerun/ (``--merge FILE --out benchmarks/results/rerun``), is set beside the table row by
row, so that the report shows how far the numbers reproduce.

Needs the ``zoo`` extra (torch, torchvision, transformers) for the export.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import cuda_ms, gpu_slug, interleaved  # noqa: E402

CACHE = REPO / "build" / "zoo"
RESULTS = REPO / "benchmarks" / "results"
RERUN = "rerun"  # results/rerun/models-<machine>.json: a second run of the table's code, for the report
SEED = 0
# The sources a package is made from: a record's "code" digest says which version of them measured it.
CODE = ("compiler/**/*.py", "schedules/**/*.py", "targets/*.json")
# Normwise relative error (max|ours - ref| / max|ref|) that counts as correct.
TOLERANCE = {"fp32": 1e-3, "fp16": 3e-2}


@dataclass(frozen=True)
class Model:
    """A zoo entry: where its definition comes from and what its inputs look like."""

    name: str
    source: str  # "torchvision" or "transformers"
    inputs: dict[str, tuple[str, tuple[int, ...], int]]  # name -> (dtype, shape without batch, int upper bound)

    def build(self):
        """The torch module (eval mode, seeded random weights), returning a tuple of output tensors."""
        import torch

        torch.manual_seed(SEED)
        if self.source == "torchvision":
            import torchvision

            net = getattr(torchvision.models, self.name)(weights=None)
        else:
            import transformers

            if self.name == "bert_base":
                net = transformers.BertModel(transformers.BertConfig())
            else:  # gpt2: prefill = logits of the whole prompt, no KV cache returned
                net = transformers.GPT2LMHeadModel(transformers.GPT2Config(use_cache=False))
        _perturb(net)
        return _tuple_outputs(net).eval()

    def example(self, batch: int, seed: int = 1) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        out = {}
        for name, (dtype, shape, high) in self.inputs.items():
            if dtype == "float32":
                out[name] = rng.standard_normal((batch, *shape)).astype(np.float32)
            elif name == "attention_mask":  # padded tail, so the masking path is exercised
                mask = np.ones((batch, *shape), np.int64)
                mask[:, -shape[-1] // 8 :] = 0
                out[name] = mask
            else:
                out[name] = rng.integers(0, high, (batch, *shape)).astype(np.int64)
        return out


IMAGE = {"image": ("float32", (3, 224, 224), 0)}
MODELS = {
    m.name: m
    for m in [
        Model("resnet50", "torchvision", IMAGE),
        Model("mobilenet_v2", "torchvision", IMAGE),
        Model("vit_b_16", "torchvision", IMAGE),
        Model("bert_base", "transformers", {"input_ids": ("int64", (128,), 30522), "attention_mask": ("int64", (128,), 2)}),
        Model("gpt2", "transformers", {"input_ids": ("int64", (256,), 50257)}),
    ]
}


def _perturb(net) -> None:
    """Give every constant-valued tensor (zero biases and heads, identity norms, BN statistics) random
    values: default inits leave ViT's head at zero, which would make any output "match"."""
    import torch

    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, t in [*net.named_parameters(), *net.named_buffers()]:
            if t.is_floating_point() and t.numel() and bool((t == t.flatten()[0]).all()):
                noise = torch.randn(t.shape, generator=g) * 0.1
                t.copy_((t + noise).abs() if name.endswith("running_var") else t + noise)


def _tuple_outputs(net):
    """Wrap ``net`` so that it returns a plain tuple of tensors (what export and the comparison want)."""
    import torch

    class TupleOutputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, *args):
            out = self.net(*args, return_dict=False) if hasattr(self.net, "config") else self.net(*args)
            return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    return TupleOutputs()


# ---------------------------------------------------------------- export + compile


def onnx_path(model: str, batch: int) -> Path:
    return CACHE / f"{model}-b{batch}.onnx"


def export(model: str, batch: int) -> Path:
    """ONNX file of ``model`` at ``batch`` (static shapes), exported once and cached (delete it to redo)."""
    path = onnx_path(model, batch)
    if path.is_file():
        return path
    import torch

    spec = MODELS[model]
    net = spec.build()
    args = tuple(torch.from_numpy(a) for a in spec.example(batch).values())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.partial")  # parallel compiles may export the same model
    with torch.no_grad():
        prog = torch.onnx.export(net, args, dynamo=True, input_names=list(spec.inputs), verbose=False)
    prog.save(str(tmp))
    os.replace(tmp, path)
    return path


def package_path(model: str, batch: int, target: str, precision: str, cuda_graph: bool) -> Path:
    return CACHE / f"{model}-b{batch}-{target}-{precision}{'-graph' if cuda_graph else ''}.tvmpkg"


def build_digest(package: str | Path) -> str:
    """12 hex digits of a package's compiled library (kernels, host code and weights; not the manifest, which
    holds a timestamp). The build is deterministic, so rows with the same digest ran the same code whatever the
    sources' digest (``code``) says: the report compares a second run by it."""
    import zipfile

    from compiler.package import LIBRARY

    with zipfile.ZipFile(package) as zf:
        return hashlib.sha256(zf.read(LIBRARY)).hexdigest()[:12]


def compile_package(model: str, batch: int, target: str, precision: str, cuda_graph: bool, reuse: bool) -> dict:
    """Export (cached) and compile one variant; returns {"package", "compile_s", "build"} or {"error"}."""
    from compiler.pipeline import Options, compile_model

    pkg = package_path(model, batch, target, precision, cuda_graph)
    if reuse and pkg.is_file():
        return {"package": str(pkg), "compile_s": None, "build": build_digest(pkg)}
    try:
        src = export(model, batch)
        t0 = time.perf_counter()
        compile_model(src, target, pkg, options=Options(precision=precision, cuda_graph=cuda_graph))
        return {"package": str(pkg), "compile_s": round(time.perf_counter() - t0, 1), "build": build_digest(pkg)}
    except Exception as err:  # one model failing must not stop the zoo: it is recorded as a failure
        return {"error": f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"}


def _kernel_summary(manifest: dict) -> dict[str, int]:
    """How many kernels came from each schedule source (hand rule, tuned, DLight rule, default)."""
    return dict(sorted(Counter(manifest["kernels"].values()).items()))


def _median(ms: list[float]) -> float:
    return float(np.median(ms))


# ---------------------------------------------------------------- CPU: vs onnxruntime


def run_cpu(models: list[str], args: argparse.Namespace) -> Iterator[dict]:
    from compiler import targets
    from compiler.compare import OrtSession, errors
    from compiler.runtime import load

    threads = targets.resolve("cpu").cores
    for name in models:
        rec = {"model": name, "target": "cpu", "batch": 1, "precision": "fp32", "threads": threads}
        built = compile_package(name, 1, "cpu", "fp32", False, args.reuse)
        if "error" in built:
            print(f"{name}: FAILED {built['error']}", flush=True)
            yield {**rec, "correct": False, "error": built["error"]}
            continue
        runner = load(built["package"])
        ort = OrtSession(str(onnx_path(name, 1)), threads)
        inputs = MODELS[name].example(1)
        err = errors(runner(**inputs), ort(inputs))
        times = interleaved({"tvmpipe": lambda: runner.time(inputs, repeat=args.repeat, warmup=1).ms,
                             "onnxruntime": lambda: ort.time(inputs, repeat=args.repeat, warmup=1)}, args.rounds)
        ours, theirs = times["tvmpipe"], times["onnxruntime"]
        rec.update(
            tvmpipe_ms=_median(ours), ort_ms=_median(theirs), speedup_vs_ort=_median(theirs) / _median(ours),
            tvmpipe_min_ms=min(ours), ort_min_ms=min(theirs),
            correct=err["max_rel_err"] <= TOLERANCE["fp32"], tolerance=TOLERANCE["fp32"], **err,
            compile_s=built["compile_s"], build=built["build"], kernels=_kernel_summary(runner.manifest), runs=len(ours),
        )
        print(f"{name}: tvmpipe {rec['tvmpipe_ms']:.2f} ms, onnxruntime {rec['ort_ms']:.2f} ms "
              f"({rec['speedup_vs_ort']:.2f}x), max rel err {err['max_rel_err']:.2e}", flush=True)
        yield rec


# ---------------------------------------------------------------- GPU: vs PyTorch eager / torch.compile


def _torch_baselines(name: str, batch: int, precision: str, args: argparse.Namespace) -> tuple[dict, list]:
    """Eager and torch.compile latencies with torch's defaults, and the float64 reference outputs."""
    import torch

    spec = MODELS[name]
    inputs = spec.example(batch)
    net = spec.build().cuda()
    with torch.no_grad():
        ref = [o.cpu().numpy() for o in net.double()(*[_to_torch(a, torch.float64) for a in inputs.values()])]
        dtype = torch.float16 if precision == "fp16" else torch.float32
        net = net.to(dtype)
        xs = [_to_torch(a, dtype) for a in inputs.values()]
        out = {"torch_eager_ms": _median(cuda_ms(lambda: net(*xs), args.repeat, args.warmup))}
        t0 = time.perf_counter()
        try:
            compiled = torch.compile(net)
            compiled(*xs)
            out["torch_compile_s"] = round(time.perf_counter() - t0, 1)
            out["torch_compile_ms"] = _median(cuda_ms(lambda: compiled(*xs), args.repeat, args.warmup))
        except Exception as err:  # recorded, so that one failing baseline does not lose the other rows
            out["torch_compile_error"] = f"{type(err).__name__}: {str(err).strip()[:200]}"
    torch._dynamo.reset()
    return out, ref


def _to_torch(a: np.ndarray, float_dtype):
    import torch

    t = torch.from_numpy(a).cuda()
    return t.to(float_dtype) if t.is_floating_point() else t


def run_gpu(models: list[str], args: argparse.Namespace) -> Iterator[dict]:
    import multiprocessing as mp

    import torch

    from compiler.compare import errors
    from compiler.runtime import load

    variants = args.variants or [(m, b, p) for m in models for b in args.batch for p in args.precision]
    # Compiling (CPU-bound, in worker processes) overlaps with the torch measurements below.
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=mp.get_context("spawn")) as pool:
        jobs = {(m, b, p): pool.submit(compile_package, m, b, "cuda-sm90", p, args.cuda_graph, args.reuse)
                for m, b, p in variants}
        for name, batch, precision in variants:
            rec = {"model": name, "target": "cuda-sm90", "batch": batch, "precision": precision,
                   "cuda_graph": args.cuda_graph}
            base, ref = _torch_baselines(name, batch, precision, args)
            rec.update(base)
            try:  # a failure (compile, load, run) is recorded and the next variant goes on
                built = jobs[(name, batch, precision)].result()
                if "error" in built:
                    raise RuntimeError(built["error"])
                runner = load(built["package"])
                inputs = MODELS[name].example(batch)
                outs = runner(**inputs)
                err = errors(outs, dict(zip(outs, ref)))
                ours = _median(runner.time(inputs, repeat=args.repeat, warmup=args.warmup).ms)
            except Exception as error:
                print(f"{name} b{batch} {precision}: FAILED {error}", flush=True)
                yield {**rec, "correct": False, "error": f"{type(error).__name__}: {str(error).strip()[:300]}"}
                continue
            if "torch_compile_ms" in rec:
                rec["speedup_vs_torch_compile"] = rec["torch_compile_ms"] / ours
            rec.update(
                tvmpipe_ms=ours, speedup_vs_torch_eager=rec["torch_eager_ms"] / ours,
                correct=err["max_rel_err"] <= TOLERANCE[precision], tolerance=TOLERANCE[precision], **err,
                compile_s=built["compile_s"], build=built["build"], kernels=_kernel_summary(runner.manifest),
            )
            print(f"{name} b{batch} {precision}: tvmpipe {ours:.3f} ms, eager {rec['torch_eager_ms']:.3f} ms, "
                  f"torch.compile {rec.get('torch_compile_ms', float('nan')):.3f} ms, "
                  f"max rel err {err['max_rel_err']:.2e}", flush=True)
            del runner
            torch.cuda.empty_cache()
            yield rec


# ---------------------------------------------------------------- results


def code_digest() -> str:
    """12 hex digits of the compiler's sources (``CODE``): rows of a table measured with different code show
    as such in the report (the GPU machine has the working tree but no git history)."""
    digest = hashlib.sha256()
    for path in sorted(f for pattern in CODE for f in REPO.glob(pattern)):
        digest.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def machine_name(target: str) -> str:
    if target == "cpu":
        from compiler import targets

        info = targets.resolve("cpu")
        return f"cpu-{info.spec['mcpu']}-{info.cores}c"
    return gpu_slug()


def environment(target: str) -> dict:
    import tvm

    env = {"python": platform.python_version(), "tvm": tvm.__version__}
    if target == "cpu":
        import onnxruntime

        env["onnxruntime"] = onnxruntime.__version__
        names = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")] if Path("/proc/cpuinfo").is_file() else []
        env["cpu"] = f"{names[0] if names else platform.machine()}, {len(os.sched_getaffinity(0))} threads"
    else:
        import torch

        env.update(torch=torch.__version__, gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda)
    return env


def save(records: list[dict], machine: str, env: dict, out_dir: Path, updated: str | None = None) -> Path:
    """Merge into <out_dir>/models-<machine>.json: records of a run replace those with the same
    (model, target, batch, precision) and keep the rest, so the zoo can be measured a few models at a time.
    ``updated`` is when the records were measured (default: now; a merge passes its file's)."""
    path = out_dir / f"models-{machine}.json"
    key = lambda r: (r["model"], r["target"], r["batch"], r["precision"])  # noqa: E731
    new = {key(r) for r in records}
    old = json.loads(path.read_text())["records"] if path.is_file() else []
    order = list(MODELS)
    merged = sorted([r for r in old if key(r) not in new] + records, key=lambda r: (order.index(r["model"]), *key(r)[1:]))
    doc = {
        "machine": machine,
        "updated": updated or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "environment": env,
        "records": merged,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


COLUMNS = ("ort_ms", "speedup_vs_ort", "torch_eager_ms", "torch_compile_ms", "speedup_vs_torch_eager",
           "speedup_vs_torch_compile")
RESULTS_MARK = "## Results"  # benchmarks/RESULTS.md: hand-written method above it, generated tables below
LABELS = {"speedup_vs_ort": "vs onnxruntime", "speedup_vs_torch_eager": "vs torch eager",
          "speedup_vs_torch_compile": "vs torch.compile"}


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def report(results_dir: Path) -> str:
    """The markdown tables, one per results file (with geomean speedups); also writes the PNG of the speedups."""
    sections, plots, current = [], [], code_digest()
    for path in sorted(results_dir.glob("models-*.json")):
        doc = json.loads(path.read_text())
        rows = doc["records"]
        gpu = rows and rows[0]["target"] != "cpu"
        env = ", ".join(f"{k} {v}" for k, v in doc["environment"].items())
        theirs = ["torch eager ms", "torch.compile ms", "vs eager", "vs torch.compile"] if gpu else ["onnxruntime ms", "vs onnxruntime"]
        names = ["model", "batch", "precision", "tvmpipe ms", *theirs, "correct (max rel err)"]
        head = "| " + " | ".join(names) + " |\n|" + "---|" * len(names)
        cols = [c for c in COLUMNS if c.startswith(("torch", "speedup_vs_torch") if gpu else ("ort", "speedup_vs_ort"))]
        lines = []
        for r in rows:
            ok = f"{'yes' if r['correct'] else 'NO'} ({r['max_rel_err']:.1e})" if "max_rel_err" in r else f"NO: {r['error']}"
            vals = ["-" if c not in r else f"{r[c]:.3f}" if c.endswith("_ms") else f"{r[c]:.2f}x" for c in cols]
            ms = f"{r['tvmpipe_ms']:.3f}" if "tvmpipe_ms" in r else "-"
            lines.append(f"| {r['model']} | {r['batch']} | {r['precision']} | {ms} | " + " | ".join(vals) + f" | {ok} |")
        gm = [f"{LABELS[c]} {geomean([r[c] for r in rows if c in r]):.2f}x" for c in cols if c.startswith("speedup")]
        sections.append(f"### {doc['machine']}\n\n{env}; updated {doc['updated']}.\n\n{head}\n" + "\n".join(lines)
                        + f"\n\nGeomean speedup ({len([r for r in rows if 'tvmpipe_ms' in r])} rows): {', '.join(gm)}."
                        + _code_note(rows, current) + "\n")
        rerun = path.parent / RERUN / path.name
        if rerun.is_file():
            sections.append(rerun_table(rows, json.loads(rerun.read_text()), cols[-1]))
        plots.append((doc["machine"], rows, [c for c in cols if c.startswith("speedup")]))
    table = "\n".join(sections)
    _plot(plots, results_dir / "models.png")
    return table


def _same_code(a: dict, b: dict) -> bool:
    """Whether two rows ran the same code: the same compiled library where both record one, else the same sources."""
    field = "build" if "build" in a and "build" in b else "code"
    return a.get(field) is not None and a.get(field) == b.get(field)


def rerun_table(rows: list[dict], second: dict, speedup: str) -> str:
    """Each row of the table beside the same row of a second run (``second``, a results document): tvmpipe's
    latency in both, its change, the headline speedup (``speedup``) in both, and whether both ran the same code."""
    key = lambda r: (r["model"], r["batch"], r["precision"])  # noqa: E731
    again = {key(r): r for r in second["records"] if speedup in r}
    pairs = [(r, again[key(r)]) for r in rows if speedup in r and key(r) in again]
    if not pairs:
        return ""
    label = LABELS[speedup]
    head = f"| model | batch | precision | tvmpipe ms | second run | change | {label} | second run | same code |\n|" + "---|" * 9
    lines, changes = [], []
    for a, b in pairs:
        changes.append(b["tvmpipe_ms"] / a["tvmpipe_ms"] - 1)
        lines.append(f"| {a['model']} | {a['batch']} | {a['precision']} | {a['tvmpipe_ms']:.3f} | {b['tvmpipe_ms']:.3f} | "
                     f"{changes[-1]:+.1%} | {a[speedup]:.2f}x | {b[speedup]:.2f}x | "
                     f"{'yes' if _same_code(a, b) else 'no'} |")
    size = [abs(c) for c in changes]
    wrong = [f"{b['model']} b{b['batch']} {b['precision']}" for _, b in pairs if not b.get("correct")]
    verdict = f"NOT correct: {', '.join(wrong)}" if wrong else "all correct"
    return (f"Second run ({second['updated']}, `{RERUN}/`): {len(pairs)} rows ({verdict}); tvmpipe's latency changed by "
            f"{_median(size):.1%} (median) and at most {max(size):.1%}; geomean {label} "
            f"{geomean([a[speedup] for a, _ in pairs]):.2f}x in the table, {geomean([b[speedup] for _, b in pairs]):.2f}x "
            f"in the second run.\n\n{head}\n" + "\n".join(lines) + "\n")


def _code_note(rows: list[dict], current: str) -> str:
    """The rows grouped by the code they were measured with (``code_digest``), unless all used this checkout's."""
    groups: dict[str, list[str]] = {}
    for r in rows:
        groups.setdefault(r.get("code", "not recorded"), []).append(f"{r['model']} b{r['batch']} {r['precision']}")
    if list(groups) == [current]:
        return f" All rows measured with this checkout's code ({current})."
    parts = [f"{'this checkout' if code == current else code}: {', '.join(names)}" for code, names in groups.items()]
    return f" Rows by the code they were measured with (this checkout's when the table was written: {current}): " + "; ".join(parts) + "."


def _plot(plots: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, max(len(plots), 1), figsize=(7 * max(len(plots), 1), 4.5), squeeze=False)
    for ax, (machine, rows, cols) in zip(axes[0], plots):
        rows = [r for r in rows if "tvmpipe_ms" in r]
        labels = [f"{r['model']}\nb{r['batch']} {r['precision']}" for r in rows]
        width = 0.8 / len(cols)
        for k, c in enumerate(cols):
            ax.bar(np.arange(len(rows)) + k * width, [r.get(c, 0) for r in rows], width, label=LABELS[c])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(np.arange(len(rows)) + width * (len(cols) - 1) / 2, labels, rotation=60, fontsize=7)
        ax.set_ylabel("speedup of tvmpipe (x)")
        ax.set_title(machine)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_report(results_dir: Path) -> None:
    table = report(results_dir)
    md = REPO / "benchmarks" / "RESULTS.md"
    head, sep, _ = md.read_text().partition(RESULTS_MARK) if md.is_file() else ("# Model zoo results\n\n", "", "")
    md.write_text(head + RESULTS_MARK + "\n\n" + table + "\n![speedups](results/models.png)\n")
    readme = REPO / "README.md"
    text = readme.read_text()
    begin, end = "<!-- zoo-results:begin -->", "<!-- zoo-results:end -->"
    block = f"{begin}\n{table.replace('### ', '#### ')}{end}"
    if begin in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text += ("\n## Model zoo\n\n`benchmarks/models.py` measures five models end to end against onnxruntime (CPU) and "
                 "PyTorch (GPU); [benchmarks/RESULTS.md](benchmarks/RESULTS.md) has the method, the commands and a plot.\n\n"
                 + block + "\n")
    readme.write_text(text)
    print(f"wrote {md}, {results_dir / 'models.png'} and the table in {readme}")


def stale_rows(path: Path, models: list[str], code: str) -> list[tuple[str, int, str]]:
    """(model, batch, precision) of the rows in results file ``path`` (of ``models``) whose code is not ``code``."""
    rows = json.loads(path.read_text())["records"] if path.is_file() else []
    return [(r["model"], r["batch"], r["precision"]) for r in rows if r["model"] in models and r.get("code") != code]


def _variant(text: str) -> tuple[str, int, str]:
    """``gpt2:32:fp16`` -> ("gpt2", 32, "fp16"), for --variants."""
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in MODELS or not parts[1].isdigit() or parts[2] not in TOLERANCE:
        raise argparse.ArgumentTypeError(f"'{text}' is not MODEL:BATCH:PRECISION with a model of {', '.join(MODELS)} "
                                         f"and a precision of {', '.join(TOLERANCE)}")
    return parts[0], int(parts[1]), parts[2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", choices=["cpu", "cuda-sm90"], help="benchmark on this target")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ", ".join(MODELS))
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32], help="GPU batch sizes (CPU: batch 1)")
    p.add_argument("--precision", nargs="+", default=["fp32", "fp16"], choices=["fp32", "fp16"], help="GPU precisions")
    p.add_argument("--variants", nargs="+", type=_variant, metavar="MODEL:BATCH:PRECISION",
                   help="GPU: exactly these rows (instead of --models x --batch x --precision)")
    p.add_argument("--stale", action="store_true",
                   help="GPU: the rows of the committed results (of --models) measured with other code than this")
    p.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false", help="GPU: plain VM launches")
    p.add_argument("--repeat", type=int, default=20, help="timed runs per round")
    p.add_argument("--rounds", type=int, default=3, help="CPU: interleaved rounds of tvmpipe / onnxruntime")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="GPU: parallel compiles")
    p.add_argument("--reuse", action="store_true", help="reuse packages already in build/zoo/ (no recompile)")
    p.add_argument("--export-only", action="store_true", help="only export the ONNX files (needs torch only)")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    p.add_argument("--merge", nargs="+", type=Path, metavar="JSON", help="merge results files (from the GPU) into --out")
    p.add_argument("--report", action="store_true", help="write RESULTS.md, the PNG and the README table")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        p.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    if (args.variants or args.stale) and args.target != "cuda-sm90":
        p.error("--variants and --stale pick GPU rows: use them with --target cuda-sm90")
    if args.export_only:
        for m in models:
            for b in ([1] if args.target == "cpu" else args.batch):
                print(export(m, b))
        return 0
    if args.target:
        os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))
        machine, env = machine_name(args.target), environment(args.target)
        correct, code = True, code_digest()
        if args.stale:
            args.variants = stale_rows(RESULTS / f"models-{machine}.json", models, code)
            print(f"{len(args.variants)} rows measured with other code: {args.variants}", flush=True)
            if not args.variants:
                return 0
        for rec in (run_cpu if args.target == "cpu" else run_gpu)(models, args):
            path = save([{**rec, "code": code}], machine, env, args.out)  # row by row: a run cut short keeps what it measured
            correct &= rec["correct"]
        print(f"wrote {path}")
        if not correct:
            return 1
    for path in args.merge or []:
        doc = json.loads(path.read_text())
        print(f"merged {path} -> {save(doc['records'], doc['machine'], doc['environment'], args.out, doc['updated'])}")
    if args.report:
        write_report(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
