"""CUDA depthwise conv2d (MobileNet): one thread per output element, the KH x KW taps unrolled in registers.

Fused with its epilogue (bias, ReLU6), DLight hands this kernel to ``GeneralReduction``, which spends a
whole thread block on each output's 9-tap reduction: the H200 ran MobileNetV2's inverted residual 20x
slower fused than unfused (``benchmarks/results/fusion-gpu.json``, 4.1 ms vs 0.2 ms). A depthwise window
is too short to split over threads; what matters is coalesced reads, so consecutive threads take
consecutive output columns, the padded input is read in place (no padded copy) and the epilogue is applied
before the single store.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumer_chain
from tvm.target import Target

from .cpu_depthwise import depthwise_conv

THREADS = 256


class GpuDepthwise(ScheduleRule):
    def apply(self, func: tirx.PrimFunc, target: Target, _: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "cuda":
            return None
        sch = s_tir.Schedule(func)
        found = depthwise_conv(sch)
        if found is None:
            return None
        conv, (n, c, oh, ow, rc, ry, rx) = found
        for producer in sch.get_producers(conv):  # the padded input: read through a bounds check instead
            sch.compute_inline(producer)
        bx, tx = sch.split(sch.fuse(n, c, oh, ow), [None, THREADS])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        acc = sch.cache_write(conv, 0, "local")
        sch.reverse_compute_at(acc, tx, preserve_unit_loops=True)
        auto_inline_consumer_chain(sch, acc)
        sch.decompose_reduction(conv, rc)
        sch.unroll(ry)
        sch.unroll(rx)
        return sch
