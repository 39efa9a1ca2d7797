"""GPU conv2d as im2col + GEMM, so that DLight's matmul rules (tensor cores for fp16) schedule it.

DLight has no convolution rule for CUDA: TVM's direct NCHW conv falls to ``dlight:Fallback`` (one thread
per output element, no tiling), orders of magnitude off cuDNN, and the TVM wheel has no cuDNN. Here the
legalisation writes the patches out (``im2col``: one memory-bound pass, cheap at HBM speed) and the conv
becomes ``out[n, oc, p] = sum_r W[oc, r] * col[n, p, r]``, a batched matmul for the tensor-core GEMM
(``gpu_matmul``; DLight's ``Matmul`` where that does not apply). The patches are written pixel-major, ``r``
contiguous, so that the GEMM needs only ``r`` (not the pixel count, 49 in ResNet's last stage) to fill
16-byte rows.
"""

from __future__ import annotations

from tvm import relax, te, topi
from tvm.target import Target

from .common import padded_conv_input


def _im2col(data: te.Tensor, kh: int, kw: int, strides, padding, dilation) -> te.Tensor:
    """col[n, (y, x), (ic, ky, kx)] = padded input under each output pixel."""
    n, ic = (int(d) for d in data.shape[:2])
    data, (oh, ow), (sh, sw), (dh, dw) = padded_conv_input(data, kh, kw, strides, padding, dilation)
    oh, ow = int(oh), int(ow)
    return te.compute(
        (n, oh * ow, ic * kh * kw),
        lambda b, p, r: data[b, r // (kh * kw), p // ow * sh + r // kw % kh * dh, p % ow * sw + r % kw * dw],
        name="im2col",
    )


def _gemm(w: te.Tensor, col: te.Tensor, out_dtype: str) -> te.Tensor:
    """out[n, oc, p] = sum_r w[oc, r] * col[n, p, r] (``w``: the weight as a matrix)."""
    oc, n_r = (int(d) for d in w.shape)
    r = te.reduce_axis((0, n_r), "r")
    return te.compute(
        (col.shape[0], oc, col.shape[1]),
        lambda b, o, p: te.sum(w[o, r].astype(out_dtype) * col[b, p, r].astype(out_dtype), axis=r),
        name="conv2d_gemm",
    )


def legalize_conv2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr | None:
    """conv2d (NCHW, OIHW, groups 1) on CUDA -> im2col, GEMM, reshape; anything else as TVM does it."""
    a = call.attrs
    target = Target.current(allow_none=True)
    plain = (a.data_layout, a.kernel_layout, a.out_layout) == ("NCHW", "OIHW", "NCHW") and int(a.groups) == 1
    if target is None or target.kind.name != "cuda" or not plain:
        return None
    _, _, kh, kw = (int(d) for d in call.args[1].ty.shape)
    out_dtype = call.ty.dtype
    col = bb.emit_te(_im2col, call.args[0], kh, kw, a.strides, a.padding, a.dilation, primfunc_name_hint="im2col")
    # the weight as a matrix, outside the GEMM's function: folded at compile time for a constant weight, so the
    # GEMM reads w[oc, r] directly (the tensor-core kernel needs A's rows contiguous)
    oc = int(call.args[1].ty.shape[0])
    w = bb.emit(relax.op.reshape(call.args[1], (oc, -1)))
    gemm = bb.emit_te(_gemm, w, col, out_dtype, primfunc_name_hint="conv2d_gemm")
    return bb.call_te(topi.reshape, gemm, [int(d) for d in call.ty.shape], primfunc_name_hint="reshape")
