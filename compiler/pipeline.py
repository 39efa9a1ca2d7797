"""The whole compile: frontend -> passes -> schedules -> tuning -> build -> package.

``prepare`` runs every stage before tuning (``tvmpipe tune`` starts there, so compile and tune see the
same kernels and the same model key); ``schedule`` applies the tuning log or the defaults; ``compile_prepared``
builds and packages. ``compile_model`` chains them.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import frontend, package, passes, precision, schedules, targets, tuning
from .build import build
from .errors import TvmpipeError
from .version import PACKAGE_FORMAT, __version__


@dataclass
class Options:
    """Switches a user can flip from the CLI, each recorded in the manifest."""

    fusion: str = "tvmpipe"  # passes.FUSION_LEVELS; --no-fusion is "none"
    custom_schedules: bool = True
    precision: str = "fp32"  # or "fp16" (GPU): mixed precision with fp32 accumulation
    cuda_graph: bool = False  # GPU: TVM's graph of the kernels between inputs and outputs (not those touching them)
    # "auto": the log in tuning_logs/<target>/<model key>/ if there is one; a directory; or None for no log
    tuning_log: str | Path | None = "auto"
    extra: dict = field(default_factory=dict)


@dataclass
class Prepared:
    """The model right before tuning: ``compile`` and ``tune`` both start from here, so they see the same kernels."""

    imported: frontend.Imported
    target: targets.TargetInfo
    mod: object  # tvm.IRModule: Relax main + fused PrimFuncs, hand-scheduled ones marked tirx.is_scheduled
    passes: list[str]
    hand: dict[str, str]  # kernel -> hand-written rule
    key: str  # tuning.model_key: names the tuning log directory


def prepare(
    model: str | Path,
    target: str,
    shapes: dict[str, tuple[int, ...]] | None = None,
    options: Options | None = None,
    observe: passes.Observer | None = None,
    bind: dict[str, np.ndarray] | None = None,
) -> Prepared:
    """Import, optimise and hand-schedule: every stage before tuning. ``bind`` freezes inputs to values."""
    options = options or Options()
    info = targets.resolve(target)
    precision.check(info, options.precision)
    if options.cuda_graph and not info.is_gpu:
        raise TvmpipeError(f"--cuda-graph is for GPU targets, not {info.name}")
    return prepare_imported(frontend.load(model, shapes, bind), info, options, observe)


def prepare_imported(
    imported: frontend.Imported, info: targets.TargetInfo, options: Options, observe: passes.Observer | None = None
) -> Prepared:
    """``prepare`` for a model already imported (``inspect`` looks at it before the passes)."""
    legalize = schedules.legalizations() if options.custom_schedules else {}
    mod = precision.apply(imported.mod, options.precision)
    mod, pass_names = passes.optimize(mod, info, fusion=options.fusion, legalize=legalize, observe=observe)
    mod, hand = schedules.apply(mod, info, enabled=options.custom_schedules)
    key = tuning.model_key(
        imported, fusion=options.fusion, custom_schedules=options.custom_schedules, precision=options.precision
    )
    return Prepared(imported, info, mod, pass_names, hand, key)


def schedule(prep: Prepared, options: Options) -> tuple[object, dict[str, str], dict | None]:
    """Tuning log (where one matches) or defaults for the rest, then (fusion "tvmpipe") output reshapes written by
    their producers (``passes.write_output_shape``): (module, {kernel: provenance}, log info)."""
    log = tuning.find_log(prep.target, prep.key) if options.tuning_log == "auto" else options.tuning_log
    mod, provenance, log_info = tuning.apply(prep.mod, prep.target, log)
    mod, folded = passes.write_output_shape(mod) if options.fusion == "tvmpipe" else (mod, [])
    kernels = {**{k: f"hand:{v}" for k, v in prep.hand.items()}, **provenance}
    return mod, {k: v for k, v in kernels.items() if k not in folded}, log_info


def compile_model(
    model: str | Path,
    target: str,
    output: str | Path,
    shapes: dict[str, tuple[int, ...]] | None = None,
    options: Options | None = None,
    bind: dict[str, np.ndarray] | None = None,
) -> dict:
    """Compile an ONNX file for a named target into a package; return its manifest. ``bind`` freezes graph
    inputs to the given values (compiled as constants; the runtime then checks any value fed for them)."""
    options = options or Options()
    return compile_prepared(prepare(model, target, shapes, options, bind=bind), output, options)


def compile_prepared(prep: Prepared, output: str | Path, options: Options | None = None) -> dict:
    """The stages after ``prepare``: tuning log / defaults, build, package; return the manifest."""
    import tvm

    options = options or Options()
    info, imported = prep.target, prep.imported
    mod, kernels, log_info = schedule(prep, options)
    built = build(mod, info, cuda_graph=options.cuda_graph)
    manifest = {
        "format": "tvmpipe-package",
        "format_version": PACKAGE_FORMAT,
        "tvmpipe_version": __version__,
        "tvm_version": tvm.__version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "target": {
            "name": info.name,
            "kind": info.kind,
            "arch": info.arch,
            "sms": info.sms,
            "spec": info.spec,
            "summary": info.isa_summary(),
            "cpu_flags": targets.host_cpu_flags() if not info.is_gpu else [],
        },
        "inputs": [s.to_json() for s in imported.inputs],
        "bound_inputs": [b.to_json() for b in imported.bound],
        "outputs": [s.to_json() for s in imported.outputs],
        "source_model": {"file": Path(imported.source).name, "sha256": imported.sha256, "opset": imported.opset},
        "passes": prep.passes,
        "options": {"fusion": options.fusion, "custom_schedules": options.custom_schedules,
                    "precision": options.precision, "cuda_graph": options.cuda_graph, **options.extra},
        "kernels": kernels,
        "tuning_log": {**log_info, "model_key": prep.key} if log_info else None,
        "weights": "embedded in model.so (VM constant pool)",
    }
    return package.save(output, built, manifest, {b.name: b.value for b in imported.bound})
