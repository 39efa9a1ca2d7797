"""Tuning stage at compile time: apply a MetaSchedule tuning log where one matches, DLight defaults for the rest on GPU.

A log is a directory, by default ``tuning_logs/<target>/<model key>/``, written by ``tvmpipe tune``
(``compiler.tuning_job``). The model key names the model rather than the compiler version: it hashes the
imported Relax graph (structure only, weights excluded, so a retrained model keeps its log), the bound input
shapes and the options that change the kernel set. Records are matched per kernel by MetaSchedule's
structural workload equality, so after a pipeline change a log still applies to every kernel that did not change.

``apply(mod, target, log)`` reports, per kernel, where its schedule came from ("tuned", "dlight:<Rule>", or
"default": plain TIR lowered as is on CPU). MetaSchedule only compares its own candidates, so ``tvmpipe tune``
also measures each kernel's default schedule (``default_schedule``) and records it in the report; a tuned record
that does not beat it is not applied, and the kernel's provenance says so ("default (tuned slower)",
"dlight:Matmul (tuned slower)"). Logs without that measurement (older ones) apply every matching record.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import tvm
from tvm import tirx

from . import tuning_log
from .errors import TvmpipeError
from .schedules import is_scheduled
from .targets import TargetInfo, cuda_arch

# Where compile looks for tuning_logs/<target>/<model key>/: the working directory's, then the repository's.
LOG_ROOTS = (Path("tuning_logs"), Path(__file__).resolve().parent.parent / "tuning_logs")

# Tensor intrinsics (VNNI / AVX-512 dot products, tensor cores) only take 8- and 16-bit operands.
_INTRINSIC_DTYPES = {"float16", "bfloat16", "int8", "uint8", "float8_e4m3fn", "float8_e5m2"}


def model_key(imported, *, fusion: str, custom_schedules: bool, precision: str = "fp32") -> str:
    """16 hex digits naming a model's tuning log (see the module docstring for what goes in)."""
    import tvm_ffi

    graph = tvm_ffi.structural_hash(imported.mod, skip_tensor_content=True)
    shapes = [(s.name, list(s.shape), s.dtype) for s in imported.inputs]
    text = json.dumps([graph, shapes, {"fusion": fusion, "custom_schedules": custom_schedules, "precision": precision}])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def log_dir(target: TargetInfo, key: str) -> Path:
    """Where ``tvmpipe tune`` writes a model's log by default."""
    return LOG_ROOTS[0] / target.name / key


def find_log(target: TargetInfo, key: str) -> Path | None:
    """The model's log under one of ``LOG_ROOTS``, if it was tuned for this target."""
    return next((d for d in (root / target.name / key for root in LOG_ROOTS) if tuning_log.exists(d)), None)


def needs_tensor_intrinsics(funcs) -> bool:
    """Whether schedules for these PrimFuncs may use tensor intrinsics (importing them costs ~18 s)."""
    from tvm.s_tir.analysis import detect_buffer_access_lca

    return any(str(buf.dtype) in _INTRINSIC_DTYPES for f in funcs for buf in detect_buffer_access_lca(f))


def _dlight_rules(target: TargetInfo) -> list:
    from tvm.s_tir import dlight as dl

    if target.is_gpu:
        return [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]
    return []


def default_schedule(func: tirx.PrimFunc, target: TargetInfo) -> tuple[tirx.PrimFunc | None, str]:
    """What a kernel gets without a log, and its provenance: a DLight rule on GPU, or None (lowered as is) on
    CPU. Call it under ``with target.target``."""
    for rule in _dlight_rules(target):
        sch = rule.apply(func, target.target, False)
        if sch is not None:
            sch = sch[0] if isinstance(sch, list) else sch
            return sch.mod["main"].with_attr("tirx.is_scheduled", True), f"dlight:{type(rule).__name__}"
    return None, "default"


def same_gpu(spec: dict, other: dict) -> bool:
    """Whether two target specs time alike: equal but for an arch-specific suffix (``sm_90`` / ``sm_90a`` are
    one GPU; the suffix only unlocks instructions such as wgmma)."""
    def base(s: dict) -> dict:
        if "arch" not in s:
            return s
        sm, suffix = cuda_arch(str(s["arch"]))
        return {**s, "arch": f"sm_{sm}"} if suffix == "a" else s

    return base(spec) == base(other)


def _open_log(log: str | Path, target: TargetInfo) -> tuple[object, dict[str, float]]:
    """The MetaSchedule database of a log directory and the default latencies (us) its report holds per
    kernel, or a clear error."""
    path = Path(log)
    if not tuning_log.exists(path):
        raise TvmpipeError(f"tuning log not found: {path} (expected {tuning_log.WORKLOADS} and {tuning_log.RECORDS})")
    report = path / tuning_log.REPORT
    meta = json.loads(report.read_text()) if report.is_file() else {}
    tuned_for = meta.get("target", {}).get("spec", target.spec)
    if not same_gpu(tuned_for, target.spec):
        warnings.warn(f"tuning log {path} was made for {tuned_for}, this target is {target.spec}: "
                      "its schedules apply, their speed may differ here")
    defaults = {t["name"]: t["default_us"] for t in meta.get("tasks", []) if t.get("default_us")}
    return tuning_log.database(path, tuning_log.read(path)), defaults


def apply(mod: tvm.IRModule, target: TargetInfo, log: str | Path | None = None) -> tuple[tvm.IRModule, dict, dict | None]:
    """Schedule every kernel not yet scheduled, from the log first; return the module, {kernel: provenance}
    and what the manifest records about the log (None without one)."""
    database, defaults = _open_log(log, target) if log is not None else (None, {})
    mod = mod.clone()  # the caller's module stays as it was (compile it again with another log)
    prims = {gv: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc) and not is_scheduled(f)}
    if database is not None and needs_tensor_intrinsics(prims.values()):
        from tvm.s_tir import tensor_intrin  # noqa: F401  (tuned traces may tensorize: replaying needs the registry)
    normalize = tvm.get_global_func("tvm.s_tir.meta_schedule.normalize_mod")  # MetaSchedule's workload form
    provenance: dict[str, str] = {}
    updates = {}
    matched = 0
    with target.target:
        for gvar, func in prims.items():
            name = gvar.name_hint
            record = database.query_tuning_record(normalize(func), target.target, name) if database else None
            matched += record is not None
            if record is not None and (name not in defaults or mean_secs(record.run_secs) * 1e6 < defaults[name]):
                new = record.as_measure_candidate().sch.mod["main"]
                if func.attrs is None or "global_symbol" not in func.attrs:  # normalize_mod added one
                    new = new.without_attr("global_symbol")
                updates[gvar] = new.with_attr("tirx.is_scheduled", True)
                provenance[name] = "tuned"
                continue
            new, provenance[name] = default_schedule(func, target)
            if new is not None:
                updates[gvar] = new
            if record is not None:
                provenance[name] += " (tuned slower)"
    for gvar, func in updates.items():
        mod[gvar] = func
    if database is None:
        return mod, provenance, None
    if not matched:
        warnings.warn(f"tuning log {log} has no record for any kernel of this model (tuned for another model?)")
    tuned = sum(v == "tuned" for v in provenance.values())
    return mod, provenance, {"path": str(log), "records": len(database), "tuned_kernels": tuned,
                             "kept_default": matched - tuned}


def mean_secs(run_secs) -> float:
    """A measurement's latency: the mean of MetaSchedule's repeated run times (seconds)."""
    return sum(float(s) for s in run_secs) / len(run_secs)
