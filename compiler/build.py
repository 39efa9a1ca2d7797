"""Build stage: a scheduled Relax module -> a VM executable, and its export to one shared library.

The passes before this one already lowered and fused (``passes``) and scheduled (``schedules``,
``tuning``) every kernel, so only TVM's dataflow lowering and VM finalisation run here.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm import relax

from . import cuda_binary
from .targets import TargetInfo


@dataclass
class Built:
    exe: object  # tvm.relax.Executable
    target: TargetInfo

    def export(self, path: Path) -> cuda_binary.GpuCode | None:
        """Write the shared library; for GPU targets with the device code compiled to cubin/PTX here."""
        if not self.target.is_gpu:
            self.exe.export_library(str(path))
            return None
        gpu: list[cuda_binary.GpuCode] = []
        pack = cuda_binary.compiled_imports(self.target.target, self.target.arch, gpu)
        self.exe.export_library(str(path), fpack_imports=pack)
        return gpu[0] if gpu else None


def _unbound_gpu_kernels(mod: tvm.IRModule) -> list[str]:
    """Kernels with no GPU thread binding. TVM would silently compile them as host code for a CUDA
    target and the package would crash at run time, so refuse to build instead."""
    return [
        gv.name_hint
        for gv, f in mod.functions.items()
        if isinstance(f, tvm.tirx.PrimFunc) and "T.thread_binding" not in (script := f.script()) and "T.launch_thread" not in script
    ]


def build(mod: tvm.IRModule, target: TargetInfo, *, cuda_graph: bool = False) -> Built:
    """Lower the Relax dataflow to VM code and compile all kernels for ``target``.

    ``cuda_graph``: the CUDA finalisation (RewriteCUDAGraph) captures the statically planned part of
    ``main`` into a CUDA graph on the first call and replays it afterwards; kernels that read an input or write an
    output stay outside (launched per call), so a model of one node gets no graph (``Runner.capture`` records all).
    """
    if target.is_gpu and (unbound := _unbound_gpu_kernels(mod)):
        raise RuntimeError(f"kernels left unscheduled for {target.name} (no thread binding): {', '.join(unbound)}")
    t = target.target
    # relax.pipeline.dataflow_lower_passes() cannot be used: the backends' __init__ does not export it.
    lower = [
        _alloc_empty_constants,
        relax.transform.RewriteDataflowReshape(),
        relax.transform.ToNonDataflow(),
        relax.transform.RemovePurityChecking(),
        relax.transform.CallTIRRewrite(),
    ]
    pipeline = tvm.transform.Sequential(lower + relax.pipeline.finalize_passes(t))
    graphs = {"relax.backend.use_cuda_graph": True}
    with (tvm.transform.PassContext(config=graphs) if cuda_graph else contextlib.nullcontext(),
          cuda_binary.exact_math() if target.is_gpu else contextlib.nullcontext()):
        return Built(tvm.compile(mod, t, relax_pipeline=pipeline), target)


@relax.expr_functor.mutator
class _AllocEmptyConstants(relax.PyExprMutator):
    """A zero-size constant cannot be serialised (the library would not load): allocate it instead."""

    def visit_generic_const_(self, const):
        if 0 not in const.value.shape:
            return const
        return relax.op.builtin.alloc_tensor(relax.ShapeExpr(list(const.value.shape)), str(const.value.dtype), 0)


@tvm.transform.module_pass(opt_level=0, name="AllocEmptyConstants")
def _alloc_empty_constants(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gvar] = _AllocEmptyConstants().visit_expr(func)
    return mod
