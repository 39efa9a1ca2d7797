"""Example plug-in: RMSNorm as the custom-domain op ``tvmpipe.example::RMSNorm``.

    Y = X / sqrt(mean(X**2, axis=-1) + epsilon) * scale        X: [..., D], scale: [D]

    tvmpipe compile examples/plugins/rmsnorm_model.onnx --plugin examples/plugins/rmsnorm.py --target cpu

The compute is TE (accumulating in float32 whatever the input type); the schedules are TensorIR, one per
target kind. On CUDA: one thread block per row, the row's threads each sum a strided slice of it and a
warp-shuffle all-reduce (TVM lowers a reduction loop bound to threadIdx.x to ``__shfl_down_sync``)
combines them; then the same threads scale the row. On CPU: rows in parallel, the inner loops
vectorised (the sum of squares through rfactor into per-lane partial sums).
"""

from __future__ import annotations

from tvm import s_tir, te, tirx

from compiler import register_op

DOMAIN, OP = "tvmpipe.example", "RMSNorm"


def rmsnorm_shape(shapes: list, dtypes: list, attrs: dict) -> list:
    x, scale = shapes
    if len(x) < 2 or scale != x[-1:]:
        raise ValueError(f"expected X of rank >= 2 and scale of shape [X.shape[-1]], got {list(x)} and {list(scale)}")
    return [(x, dtypes[0])]


def _rows_and_width(sch: s_tir.Schedule) -> tuple[s_tir.SBlockRV, s_tir.SBlockRV, s_tir.LoopRV, s_tir.LoopRV]:
    """Both blocks, with the output's row loops fused into one: (sumsq, norm, row, d)."""
    sumsq, norm = sch.get_sblock("sumsq"), sch.get_sblock("rmsnorm")
    *rows, d = sch.get_loops(norm)
    return sumsq, norm, sch.fuse(*rows), d


def schedule_cuda(sch: s_tir.Schedule) -> None:
    sumsq, norm, row, d = _rows_and_width(sch)
    width = int(sch.get(d).extent)
    threads = 32 * min(8, -(-width // 256))  # one warp up to D=256, up to 8 warps (one per 256 elements)
    sch.bind(row, "blockIdx.x")
    _, tx = sch.split(d, [None, threads])
    sch.bind(tx, "threadIdx.x")
    sch.compute_at(sumsq, row)
    *_, k = sch.get_loops(sumsq)
    ko, tk = sch.split(k, [None, threads])
    sch.reorder(tk, ko)  # each thread: a strided serial sum; then the cross-thread (shuffle) reduction
    sch.bind(tk, "threadIdx.x")
    sch.set_scope(sumsq, 0, "shared")  # the row's sum, read by all its threads


def schedule_cpu(sch: s_tir.Schedule) -> None:
    sumsq, norm, row, d = _rows_and_width(sch)
    width = int(sch.get(d).extent)
    lanes = next((v for v in (16, 8, 4, 2) if width % v == 0), None)  # a vector loop without a tail
    sch.parallel(row)
    if lanes is None:  # odd width: rows in parallel, scalar inner loops
        sch.compute_at(sumsq, row)
        return
    _, vk = sch.split(sch.get_loops(sumsq)[-1], [None, lanes])
    partial = sch.rfactor(vk, 0)  # `lanes` partial sums of squares, added up once per row
    sch.compute_at(sumsq, row)
    sch.compute_at(partial, row)
    lane, step = sch.get_loops(partial)[-2:]
    sch.reorder(step, lane)
    sch.vectorize(lane)
    _, vd = sch.split(d, [None, lanes])
    sch.vectorize(vd)


@register_op(DOMAIN, OP, shape=rmsnorm_shape, schedule={"cuda": schedule_cuda, "cpu": schedule_cpu})
def rmsnorm(x: te.Tensor, scale: te.Tensor, epsilon: float = 1e-5) -> te.Tensor:
    *rows, width = x.shape
    k = te.reduce_axis((0, width), "k")

    def xf(*i):
        return x[i].astype("float32")

    sumsq = te.compute(tuple(rows), lambda *r: te.sum(xf(*r, k) * xf(*r, k), axis=k), name="sumsq")
    inv = lambda *r: tirx.rsqrt(sumsq[r] / width.astype("float32") + tirx.const(epsilon, "float32"))  # noqa: E731
    return te.compute(
        x.shape, lambda *i: (xf(*i) * inv(*i[:-1]) * scale[i[-1]].astype("float32")).astype(x.dtype), name="rmsnorm"
    )
