"""Clip as Relax ``maximum``/``minimum`` ops.

The upstream converter emits Clip as TE ``call_tir`` kernels, which graph passes cannot see through:
ToMixedPrecision (``--precision fp16``) aborts on them, and ReLU6 (MobileNetV2's activation) is a Clip.
The bounds and their NaN handling (a NaN bound means unbounded, as in onnxruntime) stay upstream's.
"""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as upstream

from .registry import register_converter


class Clip(upstream.Clip):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        dtype = inputs[0].ty.dtype
        lo, hi = (relax.const(float(attr.get(k, d)), dtype) for k, d in (("min", -np.inf), ("max", np.inf)))
        return relax.op.minimum(bb.emit(relax.op.maximum(inputs[0], lo)), hi)

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        out = inputs[0]
        if inputs[1] is not None:
            out = bb.emit(relax.op.maximum(out, cls._sanitize_nan_clip_bound(bb, inputs[1], for_min=True)))
        if inputs[2] is not None:
            out = bb.emit(relax.op.minimum(out, cls._sanitize_nan_clip_bound(bb, inputs[2], for_min=False)))
        return out


register_converter("", "Clip", Clip)
