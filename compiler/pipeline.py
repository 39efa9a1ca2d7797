"""The whole compile: frontend -> passes -> schedules -> tuning -> build -> package, in one call."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path

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
    cuda_graph: bool = False  # GPU: replay the whole model as one CUDA graph
    extra: dict = field(default_factory=dict)


def lower(
    imported: frontend.Imported, info: targets.TargetInfo, options: Options, observe: passes.Observer | None = None
):
    """Passes, schedules and tuning (everything but the build): (module, pass names, {kernel: provenance})."""
    legalize = schedules.legalizations() if options.custom_schedules else {}
    mod = precision.apply(imported.mod, options.precision)
    mod, pass_names = passes.optimize(mod, info, fusion=options.fusion, legalize=legalize, observe=observe)
    mod, hand = schedules.apply(mod, info, enabled=options.custom_schedules)
    mod, provenance = tuning.apply(mod, info)
    return mod, pass_names, {**{k: f"hand:{v}" for k, v in hand.items()}, **provenance}


def compile_model(
    model: str | Path,
    target: str,
    output: str | Path,
    shapes: dict[str, tuple[int, ...]] | None = None,
    options: Options | None = None,
) -> dict:
    """Compile an ONNX file for a named target into a package; return its manifest."""
    import tvm

    options = options or Options()
    info = targets.resolve(target)
    precision.check(info, options.precision)
    if options.cuda_graph and not info.is_gpu:
        raise TvmpipeError(f"--cuda-graph is for GPU targets, not {info.name}")
    imported = frontend.load(model, shapes)
    mod, pass_names, kernels = lower(imported, info, options)
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
            "spec": info.spec,
            "summary": info.isa_summary(),
            "cpu_flags": targets.host_cpu_flags() if not info.is_gpu else [],
        },
        "inputs": [s.to_json() for s in imported.inputs],
        "outputs": [s.to_json() for s in imported.outputs],
        "source_model": {"file": Path(model).name, "sha256": imported.sha256, "opset": imported.opset},
        "passes": pass_names,
        "options": {"fusion": options.fusion, "custom_schedules": options.custom_schedules,
                    "precision": options.precision, "cuda_graph": options.cuda_graph, **options.extra},
        "kernels": kernels,
        "tuning_log": None,
        "weights": "embedded in model.so (VM constant pool)",
    }
    return package.save(output, built, manifest)
