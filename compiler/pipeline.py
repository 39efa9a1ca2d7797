"""The whole compile: frontend -> passes -> schedules -> tuning -> build -> package, in one call."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path

from . import frontend, package, passes, schedules, targets, tuning
from .build import build
from .version import PACKAGE_FORMAT, __version__


@dataclass
class Options:
    """Switches a user can flip from the CLI, each recorded in the manifest."""

    fusion: bool = True
    custom_schedules: bool = True
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
    model: str | Path, target: str, shapes: dict[str, tuple[int, ...]] | None = None, options: Options | None = None
) -> Prepared:
    """Import, optimise and hand-schedule: every stage before tuning."""
    options = options or Options()
    info = targets.resolve(target)
    imported = frontend.load(model, shapes)
    legalize = schedules.legalizations() if options.custom_schedules else {}
    mod, pass_names = passes.optimize(imported.mod, info, fusion=options.fusion, legalize=legalize)
    mod, hand = schedules.apply(mod, info, enabled=options.custom_schedules)
    key = tuning.model_key(imported, fusion=options.fusion, custom_schedules=options.custom_schedules)
    return Prepared(imported, info, mod, pass_names, hand, key)


def compile_model(
    model: str | Path,
    target: str,
    output: str | Path,
    shapes: dict[str, tuple[int, ...]] | None = None,
    options: Options | None = None,
) -> dict:
    """Compile an ONNX file for a named target into a package; return its manifest."""
    options = options or Options()
    return compile_prepared(prepare(model, target, shapes, options), output, options)


def compile_prepared(prep: Prepared, output: str | Path, options: Options | None = None) -> dict:
    """The stages after ``prepare``: tuning log / DLight, build, package; return the manifest."""
    import tvm

    options = options or Options()
    info, imported, hand = prep.target, prep.imported, prep.hand
    log = tuning.find_log(info, prep.key) if options.tuning_log == "auto" else options.tuning_log
    mod, provenance, log_info = tuning.apply(prep.mod, info, log)
    kernels = {**{k: f"hand:{v}" for k, v in hand.items()}, **provenance}
    built = build(mod, info)
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
            "spec": info.spec,
            "summary": info.isa_summary(),
            "cpu_flags": targets.host_cpu_flags() if not info.is_gpu else [],
        },
        "inputs": [s.to_json() for s in imported.inputs],
        "outputs": [s.to_json() for s in imported.outputs],
        "source_model": {"file": Path(imported.source).name, "sha256": imported.sha256, "opset": imported.opset},
        "passes": prep.passes,
        "options": {"fusion": options.fusion, "custom_schedules": options.custom_schedules, **options.extra},
        "kernels": kernels,
        "tuning_log": {**log_info, "model_key": prep.key} if log_info else None,
        "weights": "embedded in model.so (VM constant pool)",
    }
    return package.save(output, built, manifest)
