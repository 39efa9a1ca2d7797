"""Graph stage: Relax graph passes, then legalisation to TIR and kernel fusion.

``optimize(mod, target, fusion=True, legalize={})`` returns a module whose Relax ``main`` calls fused
PrimFuncs (one per kernel), plus the names of the passes applied (recorded in the package manifest).
``fusion=False`` (``--no-fusion``) keeps TVM's own lowering, for comparison. ``legalize`` maps Relax op
names to custom legalisations (``schedules.LEGALIZE``: ops whose kernels we hand-write get a canonical
PrimFunc there); the pipeline passes it in, so this stage never imports the schedules.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..targets import TargetInfo

# tvmpipe's own graph passes, applied before lowering when fusion is on: (name, pass factory).
GRAPH_PASSES: list[tuple[str, object]] = [
    ("FoldConstant", relax.transform.FoldConstant),
    ("DeadCodeElimination", relax.transform.DeadCodeElimination),
]

# TVM's lowering to TIR and its fuser: always applied (they are also what TVM's default pipeline does).
LOWERING: list[tuple[str, object]] = [
    ("DispatchSampling", relax.backend.DispatchSampling),
    ("DispatchSortScan", relax.backend.DispatchSortScan),
    ("LegalizeOps", relax.transform.LegalizeOps),
    ("AnnotateTIROpPattern", relax.transform.AnnotateTIROpPattern),
    ("FoldConstant", relax.transform.FoldConstant),
    ("FuseOps", relax.transform.FuseOps),
    ("FuseTIR", relax.transform.FuseTIR),
    ("DeadCodeElimination", relax.transform.DeadCodeElimination),
]


def optimize(
    mod: tvm.IRModule, target: TargetInfo, *, fusion: bool = True, legalize: dict | None = None
) -> tuple[tvm.IRModule, list[str]]:
    """Apply the graph passes (if ``fusion``) and the lowering; return the module and pass names."""
    steps = (GRAPH_PASSES if fusion else []) + LOWERING
    with target.target:
        for name, make in steps:
            mod = make(customize_legalize_map=legalize or None)(mod) if name == "LegalizeOps" else make()(mod)
    return mod, [name for name, _ in steps]
