"""Hand-written TensorIR schedules, one rule class per file, each a DLight ``ScheduleRule`` whose
``apply(func, target, tunable) -> Schedule | None``.

``RULES`` is the order in which ``compiler.schedules`` offers a kernel to the rules: the kernels we
write ourselves (softmax, attention) first, then the CPU defaults for what TVM would leave unscheduled, and GPU kernels DLight schedules badly
(depthwise convolutions, tensor-core GEMMs, vectorised elementwise kernels).
"""

import inspect

from tvm.script.parser.core.parser import ScriptMacro

from . import attention, cpu_conv2d, gpu_conv2d, softmax
from .common import first_applicable
from .cpu_conv2d import CpuConv2d
from .cpu_depthwise import CpuDepthwise
from .cpu_elementwise import CpuElementwise
from .cpu_fast_math import FAST_MATH
from .cpu_matmul import CpuMatmul, legalize_matmul
from .cpu_pool import CpuPool
from .cpu_row_reduction import CpuRowReduction, legalize_trailing_reduction
from .gpu_depthwise import GpuDepthwise
from .gpu_elementwise import GpuElementwise
from .gpu_matmul import GpuMatmul


def _find_parser_def(self: ScriptMacro):
    """The parser of the TVMScript function that expands a macro: the first frame up the stack holding one, as
    TVM 0.27's own lookup, which gets there through ``inspect.getouterframes``: that builds every frame's source
    context, and ``inspect.getmodule`` scans ``sys.modules`` for each (CPython issue 92041), 0.06-0.3 s per macro
    call by the stack's depth. Our kernels expand dozens of macros: flash attention took 4 s to parse (22 s under
    pytest), 0.7 s with this walk over ``frame.f_back``."""
    frame = inspect.currentframe()
    while frame is not None:
        parser = frame.f_globals.get(ScriptMacro.parser_object_name)
        if parser is not None:
            return parser
        frame = frame.f_back
    raise RuntimeError(f"{ScriptMacro.parser_object_name} not available")


ScriptMacro._find_parser_def = _find_parser_def  # the same result, without the frames' source context

RULES: list = [
    softmax.Softmax(),
    attention.Attention(),
    CpuConv2d(),
    CpuDepthwise(),
    CpuPool(),
    GpuDepthwise(),
    GpuMatmul(),
    CpuMatmul(),
    CpuRowReduction(),
    CpuElementwise(),
    GpuElementwise(),
]

# Relax op name -> custom legalisation (``(bb, call) -> Expr``, as LegalizeOps' customize_legalize_map):
# ops whose kernel we hand-write are lowered to a canonical PrimFunc that the matching rule recognises.
LEGALIZE: dict = {
    "relax.nn.softmax": softmax.legalize_softmax,
    "relax.nn.log_softmax": softmax.legalize_log_softmax,
    "relax.nn.attention": attention.legalize,
    "relax.nn.attention_bias": attention.legalize,
    "relax.nn.conv2d": first_applicable(cpu_conv2d.legalize_conv2d, gpu_conv2d.legalize_conv2d),
    "relax.matmul": first_applicable(legalize_matmul),
    "relax.mean": first_applicable(legalize_trailing_reduction),
    "relax.sum": first_applicable(legalize_trailing_reduction),
    **FAST_MATH,
}
