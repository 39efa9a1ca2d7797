"""The ``tvmpipe`` command line: a thin layer over ``compiler.pipeline`` and ``compiler.runtime``.

User errors (``TvmpipeError``) print one line and exit 2; anything else is a bug: one line and exit 1,
or the full traceback with ``--debug``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from .errors import TvmpipeError

REPO = Path(__file__).resolve().parent.parent
DEMO_MODEL = REPO / "models" / "demo.onnx"


def _shapes(items: list[str] | None) -> dict[str, tuple[int, ...]]:
    from .frontend.onnx_clean import parse_shape_arg

    shapes: dict[str, tuple[int, ...]] = {}
    for item in items or []:
        name, shape = parse_shape_arg(item)
        if name in shapes:
            raise TvmpipeError(f"--input-shape given twice for '{name}'")
        shapes[name] = shape
    return shapes


def _bindings(items: list[str] | None) -> dict[str, np.ndarray]:
    """``--bind-input NAME=FILE.npy`` (one input) or ``--bind-input FILE.npz`` (one per array name)."""
    values: dict[str, np.ndarray] = {}
    for item in items or []:
        name, sep, path = item.partition("=")
        if sep and name and path:
            if not Path(path).is_file():
                raise TvmpipeError(f"--bind-input {item}: file not found")
            try:
                found = {name: np.load(path, allow_pickle=False)}
            except (ValueError, OSError, EOFError) as err:
                raise TvmpipeError(f"--bind-input {item}: {path} is not a readable .npy file ({err})") from None
            if not isinstance(found[name], np.ndarray):
                raise TvmpipeError(f"--bind-input {item}: {path} holds several arrays; use NAME=FILE.npy or FILE.npz")
        elif not sep and item.endswith(".npz"):
            found = _load_npz(item)
        else:
            raise TvmpipeError(f"malformed --bind-input '{item}': expected NAME=FILE.npy or FILE.npz")
        for name, value in found.items():
            if name in values:
                raise TvmpipeError(f"--bind-input gives input '{name}' twice")
            values[name] = value
    return values


def _load_npz(path: str) -> dict[str, np.ndarray]:
    p = Path(path)
    if not p.is_file():
        raise TvmpipeError(f"inputs file not found: {path}")
    try:
        with np.load(p, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (ValueError, OSError, EOFError) as err:
        raise TvmpipeError(f"{path} is not a readable .npz file of arrays ({err})") from None


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GB"


# ---------------------------------------------------------------- commands


def cmd_targets(args: argparse.Namespace) -> int:
    from . import targets

    rows = [targets.resolve(n) for n in targets.names()]
    if args.json:
        print(json.dumps([{"name": t.name, "kind": t.kind, "summary": t.isa_summary(), "target": t.spec,
                           **({"sms": t.sms} if t.is_gpu else {})} for t in rows]))
        return 0
    width = max(len(t.name) for t in rows)
    for t in rows:
        print(f"{t.name:<{width}}  {t.isa_summary():<28}  {t.description}")
    return 0


def _compile(model: str, target: str, output: str | None, shapes, bind=None, **opts) -> tuple[dict, Path, float]:
    from .pipeline import Options, compile_model

    out = Path(output) if output else Path(f"{Path(model).stem}-{target.replace('/', '_')}.tvmpkg")
    t0 = time.perf_counter()
    manifest = compile_model(model, target, out, shapes, Options(**opts), bind=bind)
    return manifest, out, time.perf_counter() - t0


def cmd_compile(args: argparse.Namespace) -> int:
    from .plugins import load_plugin

    plugins = [load_plugin(p) for p in args.plugin or []]
    manifest, out, secs = _compile(
        args.model, args.target, args.output, _shapes(args.input_shape), _bindings(args.bind_input),
        fusion="none" if args.no_fusion else "tvmpipe", custom_schedules=not args.no_custom_schedules,
        precision=args.precision, cuda_graph=args.cuda_graph, extra={"plugins": plugins} if plugins else {},
        tuning_log=None if args.no_tuning_log else args.tuning_log or "auto",
    )
    gpu = manifest.get("gpu_code")
    extra = f", GPU code: {gpu['format']} ({' + '.join(gpu['images'])})" if gpu else ""
    log = manifest["tuning_log"]
    if log:
        kept = f", {log['kept_default']} kept their default (tuned slower)" if log["kept_default"] else ""
        extra += f", {log['tuned_kernels']} kernels tuned{kept} (log {log['path']})"
    if manifest["bound_inputs"]:
        extra += f", bound at compile time: {', '.join(b['name'] for b in manifest['bound_inputs'])}"
    print(
        f"compiled {args.model} for {manifest['target']['name']} ({manifest['target']['summary']}) -> {out}: "
        f"{len(manifest['kernels'])} kernels, {_human_bytes(out.stat().st_size)}{extra}, {secs:.1f} s"
    )
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from .report import format_text, inspect_model

    report = inspect_model(args.model, args.target, _shapes(args.input_shape),
                           fusion="none" if args.no_fusion else "tvmpipe", custom_schedules=not args.no_custom_schedules,
                           dump_dir=args.dump_ir,
                           bind=_bindings(args.bind_input))
    print(json.dumps(report) if args.json else format_text(report))
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from . import tuning, tuning_job, tuning_log
    from .pipeline import Options, prepare

    if args.trials is None and not args.compact:
        raise TvmpipeError("tune needs --trials N (tune), --compact (shrink the log), or both")
    if args.keep < 1:
        raise TvmpipeError(f"--keep must be at least 1 (got {args.keep})")
    options = Options(fusion="none" if args.no_fusion else "tvmpipe", custom_schedules=not args.no_custom_schedules)
    prep = prepare(args.model, args.target, _shapes(args.input_shape), options, bind=_bindings(args.bind_input))
    log_dir = Path(args.log_dir) if args.log_dir else tuning.log_dir(prep.target, prep.key)
    if args.trials is not None:
        tuning_job.tune(prep, trials=args.trials, log_dir=log_dir, resume=args.resume, cost_model=args.cost_model,
                        rpc=args.rpc, rpc_key=args.rpc_key, seed=args.seed)
        use = "applies it" if args.log_dir is None else f"--tuning-log {log_dir} applies it"
        print(f"tuning log: {log_dir}; tvmpipe compile {args.model} --target {args.target} {use}")
    if args.compact:
        if not tuning_log.exists(log_dir):
            raise TvmpipeError(f"no tuning log at {log_dir}")
        before, after = tuning_log.compact(log_dir, args.keep)
        print(f"compacted {log_dir}: kept {after} of {before} records (the best {args.keep} of each kernel)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .runtime import load

    runner = load(args.package)
    outputs = runner(**_load_npz(args.inputs))
    if args.outputs:
        np.savez(args.outputs, **outputs)
        print(f"wrote {', '.join(outputs)} to {args.outputs}")
    else:
        for name, a in outputs.items():
            flat = np.asarray(a).ravel()
            head = np.array2string(flat[:6], precision=5, separator=", ")
            print(f"{name}: {a.dtype}{list(a.shape)} {head}{' ...' if flat.size > 6 else ''}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .runtime import Timing, load, profile_table

    runner = load(args.package)
    inputs = _load_npz(args.inputs) if args.inputs else runner.random_inputs()
    result: dict = {"package": args.package, "target": runner.manifest["target"]["name"],
                    "cuda_graph": args.cuda_graph}
    graph = runner.capture(inputs) if args.cuda_graph else None
    timer = graph.time if graph else lambda **kw: runner.time(inputs, **kw)
    result.update(timer(repeat=args.repeat, warmup=args.warmup).summary())
    lines = [f"{'tvmpipe (graph)' if graph else 'tvmpipe':<17}mean {result['mean_ms']:.4f} ms  "
             f"median {result['median_ms']:.4f} ms  p90 {result['p90_ms']:.4f} ms  p99 {result['p99_ms']:.4f} ms  "
             f"({args.repeat} runs)"]
    if args.compare_onnx:
        from .compare import OrtSession, errors

        threads = runner.manifest["target"]["spec"].get("num-cores") if runner.manifest["target"]["kind"] == "cpu" else None
        ort = OrtSession(args.compare_onnx, threads)
        ort_inputs = {**runner.bound_values, **inputs}  # onnxruntime still takes the bound inputs
        result.update(errors(graph(**inputs) if graph else runner(**inputs), ort(ort_inputs)))
        ort_t = Timing(ort.time(ort_inputs, repeat=args.repeat, warmup=args.warmup)).summary()
        result.update({f"ort_{k}": v for k, v in ort_t.items() if k.endswith("_ms")})
        result["speedup_vs_ort"] = result["ort_median_ms"] / result["median_ms"]
        lines.append(f"{'onnxruntime':<17}mean {result['ort_mean_ms']:.4f} ms  median {result['ort_median_ms']:.4f} ms  "
                     f"p90 {result['ort_p90_ms']:.4f} ms  p99 {result['ort_p99_ms']:.4f} ms")
        lines.append(f"speedup vs onnxruntime {result['speedup_vs_ort']:.2f}x; max abs err {result['max_abs_err']:.3g}, "
                     f"max rel err {result['max_rel_err']:.3g}")
    if args.profile:
        kernels = runner.profile(inputs, repeat=max(1, min(args.repeat, 20)))
        result["kernels"] = [vars(k) for k in kernels]
        lines += profile_table(kernels)
    if args.json:
        print(json.dumps(result))
    else:
        print("\n".join(lines))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .compare import OrtSession, errors
    from .runtime import Timing, load

    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    batch = 2
    manifest, pkg, secs = _compile(str(DEMO_MODEL), args.target, str(out_dir / f"demo-{args.target}.tvmpkg"),
                                   {"image": (batch, 3, 32, 32)})
    runner = load(str(pkg))
    inputs = runner.random_inputs(seed=int(time.time()))
    threads = manifest["target"]["spec"].get("num-cores")
    ort = OrtSession(str(DEMO_MODEL), threads)
    err = errors(runner(**inputs), ort(inputs))
    ok = err["max_rel_err"] <= 1e-4
    ours = runner.time(inputs, repeat=100).summary()["median_ms"]
    theirs = Timing(ort.time(inputs, repeat=100)).summary()["median_ms"]
    rows = [
        ("model", f"{DEMO_MODEL.relative_to(REPO)} (CNN stem + transformer block, batch {batch})"),
        ("target", f"{manifest['target']['name']} ({manifest['target']['summary']})"),
        ("compile", f"{secs:.1f} s -> {pkg} ({len(manifest['kernels'])} kernels, {_human_bytes(pkg.stat().st_size)})"),
        ("correctness", f"max rel err {err['max_rel_err']:.2e} vs onnxruntime: {'OK' if ok else 'MISMATCH'}"),
        ("latency", f"tvmpipe {ours:.3f} ms, onnxruntime {theirs:.3f} ms (median of 100, {threads} threads)"),
    ]
    for k, v in rows:
        print(f"{k:<12} {v}")
    return 0 if ok else 1


# ---------------------------------------------------------------- parser

BIND = ("freeze a graph input to this value at compile time (NAME=FILE.npy, or FILE.npz for one per array "
        "name; repeatable): it may then decide shapes; run checks any value fed for it")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show full tracebacks")
    p = argparse.ArgumentParser(prog="tvmpipe", description="Compile ONNX models with TVM.", parents=[common])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("targets", parents=[common], help="list the named targets")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_targets)

    # what compile, inspect and tune take alike: the model, its target and how it is imported and scheduled
    model = argparse.ArgumentParser(add_help=False, parents=[common])
    model.add_argument("model")
    model.add_argument("--target", "-t", required=True, help="target name (tvmpipe targets) or a target .json")
    model.add_argument("--input-shape", action="append", metavar="NAME:1x3x224x224",
                       help="static shape for an input (repeat per input)")
    model.add_argument("--bind-input", action="append", metavar="NAME=FILE.npy", help=BIND)
    model.add_argument("--no-fusion", action="store_true", help="no fusion at all: one kernel per op (for comparison)")
    model.add_argument("--no-custom-schedules", action="store_true", help="keep TVM's default schedules for all kernels")

    s = sub.add_parser("compile", parents=[model], help="compile an ONNX model into a .tvmpkg package")
    s.add_argument("-o", "--output", help="package path (default: MODEL-TARGET.tvmpkg)")
    s.add_argument("--plugin", action="append", metavar="FILE.py",
                   help="import a plug-in that registers custom ops (compiler.register_op); repeatable")
    s.add_argument("--precision", choices=["fp32", "fp16"], default="fp32",
                   help="fp16 (GPU targets): fp16 conv/matmul with fp32 accumulation; inputs/outputs stay fp32")
    s.add_argument("--cuda-graph", action="store_true",
                   help="GPU targets: replay the kernels that neither read an input nor write an output as one CUDA "
                        "graph (TVM's; bench --cuda-graph / Runner.capture record the whole call of a package built "
                        "without it)")
    s.add_argument("--tuning-log", metavar="DIR",
                   help="apply this tuning log (default: tuning_logs/TARGET/MODEL-KEY/ if it exists)")
    s.add_argument("--no-tuning-log", action="store_true", help="apply no tuning log")
    s.set_defaults(func=cmd_compile)

    s = sub.add_parser("inspect", parents=[model], help="show the kernels after fusion, their ops and the bytes saved")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--dump-ir", metavar="DIR", help="write the IR after every pass into DIR")
    s.set_defaults(func=cmd_inspect)

    s = sub.add_parser("tune", parents=[model], help="auto-tune the kernels of a model with MetaSchedule")
    s.add_argument("--trials", type=int, help="total measurements in the log, split over the kernels")
    s.add_argument("--log-dir", help="the log directory (default: tuning_logs/TARGET/MODEL-KEY/)")
    s.add_argument("--resume", action="store_true", help="continue the job in the log directory up to --trials")
    s.add_argument("--cost-model", choices=["xgb", "random"], default="xgb")
    s.add_argument("--seed", type=int, help="seed the search (default: random)")
    s.add_argument("--rpc", metavar="HOST:PORT", help="measure on the RPC servers of this TVM RPC tracker")
    s.add_argument("--rpc-key", metavar="KEY", help="the device key the servers registered with")
    s.add_argument("--compact", action="store_true", help="then keep only the best --keep records of each kernel")
    s.add_argument("--keep", type=int, default=4, help="records per kernel kept by --compact (default 4)")
    s.set_defaults(func=cmd_tune)

    s = sub.add_parser("run", parents=[common], help="run a package on inputs from an .npz file")
    s.add_argument("package")
    s.add_argument("--inputs", required=True, help=".npz with one array per input name")
    s.add_argument("--outputs", help="write outputs to this .npz (default: print a summary)")
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("bench", parents=[common], help="measure a package's latency")
    s.add_argument("package")
    s.add_argument("--inputs", help=".npz inputs (default: random)")
    s.add_argument("--repeat", type=int, default=100)
    s.add_argument("--warmup", type=int, default=10)
    s.add_argument("--compare-onnx", metavar="MODEL.onnx", help="also run onnxruntime on the same inputs")
    s.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    s.add_argument("--cuda-graph", action="store_true",
                   help="GPU packages built without --cuda-graph: time the whole call recorded into one CUDA graph and "
                        "replayed (inputs and outputs on fixed device buffers, as torch's CUDA graphs)")
    s.add_argument("--profile", action="store_true",
                   help="also time each kernel (synchronised per call: for ranking them, not for the total)")
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser("demo", parents=[common], help="compile, run and check the bundled demo model")
    s.add_argument("--target", default="cpu")
    s.add_argument("-o", "--output-dir", default="out")
    s.set_defaults(func=cmd_demo)
    return p


def _format_warning(message, category, filename, lineno, line=None) -> str:
    return f"tvmpipe: warning: {message}\n"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.formatwarning = _format_warning
    try:
        return args.func(args)
    except TvmpipeError as err:
        if args.debug:
            raise
        print(f"tvmpipe: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tvmpipe: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a bug: keep it short unless asked
        if args.debug:
            raise
        first = (str(err).strip().splitlines() or [""])[0]
        print(f"tvmpipe: internal error: {type(err).__name__}: {first} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1
