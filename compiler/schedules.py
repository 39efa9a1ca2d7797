"""Schedule stage: hand-written TensorIR schedules (``schedules/``) for the kernels they cover.

Every rule is a DLight ``ScheduleRule``: ``apply(func, target, tunable) -> Schedule | None``; each PrimFunc that no earlier
stage scheduled is offered to the rules in order and the first schedule returned replaces it, marked
``tirx.is_scheduled`` so that tuning and DLight leave it alone. Plug-in kernels go to the user's own
schedule first (``plugins.PluginSchedule``).
"""

from __future__ import annotations

import warnings

import tvm
from tvm import tirx

from schedules import LEGALIZE, RULES
from schedules.common import planning_for

from .errors import TvmpipeError, summary
from .plugins import PluginSchedule
from .targets import TargetInfo


def is_scheduled(func: tvm.tirx.PrimFunc) -> bool:
    return bool(func.attrs is not None and func.attrs.get("tirx.is_scheduled", False))


def legalizations() -> dict:
    """Custom legalisations of the ops our kernels cover (for ``passes.optimize``)."""
    return dict(LEGALIZE)


def apply(mod: tvm.IRModule, target: TargetInfo, *, enabled: bool = True) -> tuple[tvm.IRModule, dict[str, str]]:
    """Schedule what our rules cover; return the module and {kernel name: rule name}."""
    chosen: dict[str, str] = {}
    if not enabled:
        return mod, chosen
    rules = [PluginSchedule(), *RULES]
    updates = {}
    with target.target, planning_for(target.sms):
        for gvar, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc) or is_scheduled(func):
                continue
            for rule in rules:
                try:
                    sch = rule.apply(func, target.target, False)
                except TvmpipeError:  # the user's to fix (a plug-in's schedule): reported as it is
                    raise
                except Exception as err:  # our rule's bug costs that kernel its schedule, not the user's compile
                    warnings.warn(f"schedule rule {type(rule).__name__} failed on kernel {gvar.name_hint} "
                                  f"({summary(err)}); the next rule takes it")
                    continue
                if sch is not None:
                    updates[gvar] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
                    chosen[gvar.name_hint] = type(rule).__name__
                    break
    for gvar, func in updates.items():
        mod[gvar] = func
    return mod, chosen
