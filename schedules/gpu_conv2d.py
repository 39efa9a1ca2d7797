"""GPU conv2d as a GEMM over the conv's own NCHW output, so that the tensor-core GEMM (``gpu_matmul``) runs it with
whatever follows (bias, activation, residual add, cast) fused as its epilogue.

DLight has no convolution rule for CUDA: TVM's direct NCHW conv falls to ``dlight:Fallback`` (one thread
per output element, no tiling), orders of magnitude off cuDNN, and the TVM wheel has no cuDNN. Here the conv
becomes ``out[n, oc, y, x] = sum_r W[oc, r] * B[n, r, (y, x)]``, a batched matmul whose columns are the output's
pixels, B read in 16-byte rows along them:

* a 1x1 stride-1 unpadded conv over a multiple of 8 pixels, of a multiple of 8 channels: B is the input itself;
* any other: B is its patches, ``col[n, r, y * ow + x]`` (``_patches``: reads and writes both run along the image
  rows), the pixels padded with zeros to a multiple of 8 (ResNet's last stage has 49), and ``r`` (input channels x
  kernel window) too (a 7x7 conv of RGB has 147), its weights zero there.

On ResNet-50 batch 32 (H100) the patches were written pixel-major, ``col[n, p, r]`` (reads gathered across
channels), for every conv, and the GEMM wrote fp32 [n, oc, p] that a separate kernel reshaped, biased, activated and
cast: those copies were 3.3 of the model's 6.3 ms. This form ran it 1.53x as fast, 1.91x with the patches stored a
vector at a time (``gpu_elementwise``) and one-warpgroup GEMM tiles (``benchmarks/results/rerun/resnet-conv-gemm/``),
then 1.156x again with the patches on a grid of rows (``rerun/resnet-patches/``) and 1.140x with wgmma tiles that
fit few pixels (``gpu_matmul.COLUMN_PADDING``, ``rerun/resnet-conv-gemm-tiles/``): 6.0 -> 2.4 ms.
"""

from __future__ import annotations

from tvm import relax, te, tirx
from tvm.target import Target

from .common import padded_conv_input

ROW = 8  # elements of a 16-byte row of fp16 (the GEMM's cp.async); fp32's 4 divide it


def _round_up(n: int) -> int:
    """``n`` rounded up to whole 16-byte rows."""
    return -(-n // ROW) * ROW


def _patches(data: te.Tensor, kh: int, kw: int, strides, padding, dilation) -> te.Tensor:
    """col[n, r, y * ow + x]: the padded input under output pixel (y, x) at window element r; zero past the window's
    ``ic * kh * kw`` rows and the ``oh * ow`` pixels (both rounded up to ``ROW``)."""
    n, ic = (int(d) for d in data.shape[:2])
    data, (oh, ow), (sh, sw), (dh, dw) = padded_conv_input(data, kh, kw, strides, padding, dilation)
    oh, ow, window = int(oh), int(ow), ic * kh * kw

    def patch(b, r, p):
        y, x = p // ow, p % ow
        value = data[b, r // (kh * kw), y * sh + r // kw % kh * dh, x * sw + r % kw * dw]
        inside = [c for c, padded in ((r < window, window % ROW), (p < oh * ow, oh * ow % ROW)) if padded]
        return tirx.if_then_else(tirx.all(*inside), value, tirx.const(0, data.dtype)) if inside else value

    return te.compute((n, _round_up(window), _round_up(oh * ow)), patch, name="im2col")


def _gemm(w: te.Tensor, src: te.Tensor, oh: int, ow: int, out_dtype: str) -> te.Tensor:
    """out[n, oc, y, x] = sum_r w[oc, r] * src[n, r, y, x] (the input itself) or src[n, r, y * ow + x] (patches)."""
    oc, rows = (int(d) for d in w.shape)
    r = te.reduce_axis((0, rows), "r")

    def b_at(n, y, x):
        return src[n, r, y, x] if len(src.shape) == 4 else src[n, r, y * ow + x]

    return te.compute(
        (src.shape[0], oc, oh, ow),
        lambda n, o, y, x: te.sum(w[o, r].astype(out_dtype) * b_at(n, y, x).astype(out_dtype), axis=r),
        name="conv2d_gemm",
    )


def legalize_conv2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr | None:
    """conv2d (NCHW, OIHW, groups 1) on CUDA -> (patches,) GEMM; anything else as TVM does it."""
    a = call.attrs
    target = Target.current(allow_none=True)
    plain = (a.data_layout, a.kernel_layout, a.out_layout) == ("NCHW", "OIHW", "NCHW") and int(a.groups) == 1
    if target is None or target.kind.name != "cuda" or not plain:
        return None
    oc, ic, kh, kw = (int(d) for d in call.args[1].ty.shape)
    _, _, oh, ow = (int(d) for d in call.ty.shape)
    window = ic * kh * kw
    # the weight as a matrix, outside the GEMM's function: folded at compile time for a constant weight, so the
    # GEMM reads w[oc, r] directly (the tensor-core kernel needs A's rows contiguous)
    w = bb.emit(relax.op.reshape(call.args[1], (oc, -1)))
    if window % ROW:
        w = bb.emit(relax.op.nn.pad(w, [0, 0, 0, _round_up(window) - window]))
    direct = (kh, kw) == (1, 1) and all(int(s) == 1 for s in a.strides) and not any(int(p) for p in a.padding)
    if direct and ic % ROW == 0 and (oh * ow) % ROW == 0:
        src = call.args[0]
    else:
        src = bb.emit_te(_patches, call.args[0], kh, kw, a.strides, a.padding, a.dilation, primfunc_name_hint="im2col")
    return bb.call_te(_gemm, w, src, oh, ow, call.ty.dtype, primfunc_name_hint="conv2d_gemm")
