"""Hand-written TensorIR schedules, one rule class per file, each a DLight ``ScheduleRule`` whose
``apply(func, target, tunable) -> Schedule | None``.

``RULES`` is the order in which ``compiler.schedules`` offers a kernel to the rules: the kernels we
write ourselves (softmax, attention) first, then the CPU defaults for what TVM would leave unscheduled, and GPU kernels DLight schedules badly
(depthwise convolutions, tensor-core GEMMs, vectorised elementwise kernels).
"""

from . import attention, cpu_conv2d, gpu_conv2d, softmax
from .common import first_applicable
from .cpu_conv2d import CpuConv2d
from .cpu_depthwise import CpuDepthwise
from .cpu_elementwise import CpuElementwise
from .cpu_fast_math import FAST_MATH
from .cpu_matmul import CpuMatmul, legalize_matmul
from .cpu_row_reduction import CpuRowReduction
from .gpu_depthwise import GpuDepthwise
from .gpu_elementwise import GpuElementwise
from .gpu_matmul import GpuMatmul

RULES: list = [
    softmax.Softmax(),
    attention.Attention(),
    CpuConv2d(),
    CpuDepthwise(),
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
    **FAST_MATH,
}
