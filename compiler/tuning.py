"""Tuning stage: apply a MetaSchedule database where one matches, DLight defaults for the rest on GPU.

``apply(mod, target)`` is the compile-time entry point; it reports, per kernel, where its
schedule came from ("tuned", "dlight:<Rule>", or "default" for plain TIR lowered as is on CPU).
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .schedules import is_scheduled
from .targets import TargetInfo


def _dlight_rules(target: TargetInfo) -> list:
    from tvm.s_tir import dlight as dl

    if target.is_gpu:
        return [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]
    return []


def apply(mod: tvm.IRModule, target: TargetInfo) -> tuple[tvm.IRModule, dict[str, str]]:
    """Schedule every kernel not yet scheduled; return the module and {kernel: provenance}."""
    provenance: dict[str, str] = {}
    rules = _dlight_rules(target)
    updates = {}
    with target.target:
        for gvar, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc) or is_scheduled(func):
                continue
            provenance[gvar.name_hint] = "default"
            for rule in rules:
                sch = rule.apply(func, target.target, False)
                if sch is not None:
                    sch = sch[0] if isinstance(sch, list) else sch
                    updates[gvar] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
                    provenance[gvar.name_hint] = f"dlight:{type(rule).__name__}"
                    break
    for gvar, func in updates.items():
        mod[gvar] = func
    return mod, provenance
