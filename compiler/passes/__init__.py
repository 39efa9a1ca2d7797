"""Graph stage: Relax graph passes, then legalisation to TIR and kernel fusion.

``optimize(mod, target, fusion=..., legalize={})`` returns a module whose Relax ``main`` calls one PrimFunc
per kernel, each tagged with the Relax ops it computes (``kernels``), plus the names of the steps applied
(recorded in the package manifest). ``legalize`` maps Relax op names to custom legalisations
(``schedules.LEGALIZE``); the pipeline passes it in, so this stage never imports the schedules.

Fusion levels, so that what fusion buys can be measured side by side (``benchmarks/fusion.py``):

- ``"tvmpipe"`` (default): our graph passes (``GRAPH_PASSES``: constant folding, constant-index takes as
  slices, BatchNorm folding, LayerNorm and attention recognition, transpose cancellation, x**2 and x**3 as
  products, reshapes moved below elementwise ops, a layout chain several slices read recomputed in each), then TVM's
  lowering with FuseOps + FuseTIR.
- ``"tvm"``: TVM's stock lowering only (LegalizeOps + FuseOps + FuseTIR), what ``tvm.compile`` does.
- ``"none"`` (``--no-fusion``): no fusion at all, ours or TVM's: every Relax op left after import is a
  kernel of its own and every intermediate tensor goes through memory (BatchNormalization included: only
  ``FoldBatchNorm`` folds it, the frontend's ONNX cleaning folds constants, it does not rewrite the graph).
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax

from ..targets import TargetInfo
from .attention import STOCK_LEGALIZE, FuseAttention
from .fold_batchnorm import FoldBatchNorm
from .kernels import OPS_ATTR, SAVED_ATTR, KernelRecorder
from .layernorm import FuseLayerNorm
from .layout import SimplifyLayout
from .output_reshape import write_output_shape
from .reshape_sink import SinkReshapes
from .slice_sources import SliceSources
from .small_powers import ExpandSmallPowers
from .take_slice import TakeAsSlice

__all__ = ["FUSION_LEVELS", "GRAPH_PASSES", "OPS_ATTR", "SAVED_ATTR", "optimize", "write_output_shape"]

FUSION_LEVELS = ("tvmpipe", "tvm", "none")

# tvmpipe's own graph passes, applied before lowering at fusion level "tvmpipe": (name, pass factory).
GRAPH_PASSES: list[tuple[str, Callable]] = [
    # first: FoldConstant legalises ``pow``, and TVM logs a warning from C++ at each legalisation of an exponent >= 3
    ("ExpandSmallPowers", ExpandSmallPowers),
    ("FoldConstant", relax.transform.FoldConstant),
    ("DeadCodeElimination", relax.transform.DeadCodeElimination),
    ("TakeAsSlice", TakeAsSlice),
    ("FoldBatchNorm", FoldBatchNorm),
    ("FuseLayerNorm", FuseLayerNorm),
    ("SimplifyLayout", SimplifyLayout),
    ("FuseAttention", FuseAttention),
    ("SimplifyLayout", SimplifyLayout),  # the transposes around the attention op cancel the exporter's
    ("SinkReshapes", SinkReshapes),
    ("RemoveRedundantReshape", relax.transform.RemoveRedundantReshape),
    ("SliceSources", SliceSources),
    ("FoldConstant", relax.transform.FoldConstant),
    ("DeadCodeElimination", relax.transform.DeadCodeElimination),
]

Observer = Callable[[str, tvm.IRModule], None]


def _lowering(fusion: str, recorder: KernelRecorder) -> list[tuple[str, Callable]]:
    """TVM's lowering to TIR (what its default CPU/GPU pipelines do), with FuseOps unless fusion is off."""
    steps = [
        ("DispatchSampling", relax.backend.DispatchSampling()),
        ("DispatchSortScan", relax.backend.DispatchSortScan()),
        ("LegalizeOps", recorder.legalize),
        ("AnnotateTIROpPattern", relax.transform.AnnotateTIROpPattern()),
        ("FoldConstant", relax.transform.FoldConstant()),
    ]
    if fusion != "none":
        steps += [
            ("FuseOps", lambda m: recorder.record_groups(relax.transform.FuseOps()(m))),
            ("FuseTIR", relax.transform.FuseTIR()),
        ]
    return steps + [
        ("TagKernels", recorder.tag),
        ("DeadCodeElimination", relax.transform.DeadCodeElimination()),
        # Kernels that only reshape become views here (the build would do it too): what is left is what runs.
        ("RewriteDataflowReshape", relax.transform.RewriteDataflowReshape()),
        ("DeadCodeElimination", relax.transform.DeadCodeElimination()),
    ]


def optimize(
    mod: tvm.IRModule,
    target: TargetInfo,
    *,
    fusion: str = "tvmpipe",
    legalize: dict | None = None,
    observe: Observer | None = None,
) -> tuple[tvm.IRModule, list[str]]:
    """Apply the graph passes (at level "tvmpipe") and the lowering; return the module and step names.

    ``observe(step_name, mod)`` is called with the module after every step (``--dump-ir``, ``inspect``).
    """
    if fusion not in FUSION_LEVELS:
        raise ValueError(f"fusion level {fusion!r} is not one of {FUSION_LEVELS}")
    graph = [(name, make()) for name, make in GRAPH_PASSES] if fusion == "tvmpipe" else []
    steps = graph + _lowering(fusion, KernelRecorder({**STOCK_LEGALIZE, **(legalize or {})}))
    with target.target:
        for name, step in steps:
            mod = step(mod)
            if observe is not None:
                observe(name, mod)
    return mod, [name for name, _ in steps]
