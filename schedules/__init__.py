"""Hand-written TensorIR schedules, one rule class per file, each a DLight ``ScheduleRule`` whose
``apply(func, target, tunable) -> Schedule | None``.

``RULES`` is the order in which ``compiler.schedules`` offers a kernel to the rules.
"""

from . import attention, softmax

RULES: list = [
    softmax.Softmax(),
    attention.Attention(),
]

# Relax op name -> custom legalisation (``(bb, call) -> Expr``, as LegalizeOps' customize_legalize_map):
# ops whose kernel we hand-write are lowered to a canonical PrimFunc that the matching rule recognises.
LEGALIZE: dict = {
    "relax.nn.softmax": softmax.legalize_softmax,
    "relax.nn.log_softmax": softmax.legalize_log_softmax,
    "relax.nn.attention": attention.legalize,
    "relax.nn.attention_bias": attention.legalize,
}
