"""Hand-written TensorIR schedules, one rule class per file, each a DLight ``ScheduleRule`` whose
``apply(func, target, tunable) -> Schedule | None``.

``RULES`` is the order in which ``compiler.schedules`` offers a kernel to the rules.
"""

RULES: list = []
