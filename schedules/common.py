"""What the rules and legalisations share: the target test, TVM's default lowering, vector sizes, CUDA facts."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import tvm
import tvm_ffi
from tvm import relax, te, tirx, topi
from tvm.script import tirx as T
from tvm.target import Target, codegen
from tvm.tirx.op import tvm_warp_shuffle_xor

from compiler.targets import DEFAULT_SMS, cuda_arch, default_sms

LOG2E = math.log2(math.e)  # exp(x) = exp2(x * LOG2E): the CUDA kernels' exp2 and the CPU's vexp
VECTOR_REGISTERS = {512: 32, 256: 16, 128: 16}  # AVX-512 / AVX2 / SSE, NEON
ACCUMULATOR_REGISTERS = {512: 24, 256: 12, 128: 12}  # of VECTOR_REGISTERS, for C tiles
# Per-arch fact the CUDA target does not carry: SM count (H100/H200 SXM, A100), where the target file gives none
# (``sm_count``). The GPU kernels' launch choices were tuned on the H200 (sm_90).
SMS = {f"sm_{cc}": n for cc, n in DEFAULT_SMS.items()}
# The SM count of the target being scheduled (``planning_for``), which ``sm_count`` returns over the arch's default.
_PLANNED_SMS: ContextVar[int | None] = ContextVar("tvmpipe_planned_sms", default=None)
# A constant weight is stored in panels of this many vectors of output columns (channels), each contiguous along
# the reduction, and the register tile takes one panel: 2 x 8 rows beat 3 x 8 once B is in panels (ViT / BERT
# FFN shapes, kernel alone: 2.2 vs 2.3 ms); four vectors were no faster
PANEL_VECTORS = 2
OUT_ELEMWISE_FUSABLE = 4  # relax OpPatternKind kOutEWiseFusable: a GEMM, elementwise consumers fuse into it


def mark_gemm(bb: relax.BlockBuilder, call: relax.Call) -> relax.Call:
    """Tag a ``call_te`` GEMM/conv whose weight is read in panels (``w[j / p, .., j % p]``, which TVM's pattern
    analysis takes for opaque) as what it is, so that FuseOps still fuses its epilogue into it."""
    gvar = call.args[0]
    bb.update_func(gvar, bb.get()[gvar].with_attr("op_pattern", OUT_ELEMWISE_FUSABLE))
    return call


def compiling_for_cpu() -> bool:
    """Inside ``passes.optimize`` the target is the current one."""
    target = Target.current(allow_none=True)
    return target is not None and target.kind.name == "llvm"


@contextmanager
def planning_for(sms: int | None) -> Iterator[None]:
    """Within: kernels are planned for a GPU of ``sms`` SMs (``compiler.schedules`` sets the target's; None: the
    arch's default). A context rather than an argument: TVM hands the rules only its own Target, which has no SM
    count."""
    token = _PLANNED_SMS.set(sms)
    try:
        yield
    finally:
        _PLANNED_SMS.reset(token)


def sm_count(arch: str = "sm_90") -> int:
    """SMs of the GPU the kernels are planned for: the target's (``planning_for``), else ``arch``'s default."""
    return _PLANNED_SMS.get() or default_sms(arch) or SMS["sm_90"]


def default_legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """TVM's own legalisation of ``call`` (for the cases a custom one does not take)."""
    return tvm.ir.Op.get(call.op.name).get_attr("FLegalize")(bb, call)


def first_applicable(*legalizers: Callable) -> Callable:
    """One LegalizeOps entry from target-specific ones, each returning None where it does not apply."""

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        for legalizer in legalizers:
            out = legalizer(bb, call)
            if out is not None:
                return out
        return default_legalize(bb, call)

    return legalize


def vector_shape(target: Target, dtype: str) -> tuple[int, int]:
    """(lanes of ``dtype`` per vector, vector registers to spend on accumulators) for the target's ISA."""
    features = set(codegen.llvm_get_cpu_features(target))
    bits = 512 if "avx512f" in features else 256 if "avx2" in features else 128
    return bits // (16 if dtype == "float16" else 32), ACCUMULATOR_REGISTERS[bits]


def elem_bytes(buf: tirx.Buffer) -> int:
    """Bytes of one element of ``buf``."""
    return tvm_ffi.dtype(str(buf.dtype)).bits // 8


def largest_divisor(n: int, candidates: tuple[int, ...]) -> int | None:
    """The first of ``candidates`` that divides ``n``."""
    return next((c for c in candidates if n % c == 0), None)


def unravel(flat, extents) -> list:
    """A flat index over ``extents`` (row-major) as one index per axis."""
    idx = []
    for e in reversed(extents):
        idx.insert(0, flat % e)
        flat = flat // e
    return idx


def ravel(indices, extents):
    """The flat row-major index of ``indices`` over ``extents`` (``unravel``'s inverse)."""
    flat = 0
    for index, extent in zip(indices, extents):
        flat = flat * extent + index
    return flat


def register_tile(rows: int, vectors: int, regs: int, nj: int | None = None, max_rows: int = 8) -> tuple[int, int]:
    """(MR rows, NJ vectors) of the accumulator tile: exact divisors of the extents, MR <= ``max_rows``,
    MR * NJ <= regs, as many accumulators as possible (ties: more vectors, which share each broadcast row value);
    ``nj`` fixes the vectors (a weight stored in panels of that width)."""
    pairs = [(m, j) for m in range(1, max_rows + 1) for j in ((nj,) if nj else range(1, 5))
             if rows % m == 0 and vectors % j == 0 and m * j <= regs]
    return max(pairs, key=lambda p: (p[0] * p[1], p[1]))


# exp2 as the bare ex2.approx.ftz.f32: CUDA's exp2f (the same instruction) adds a compare and two multiplies per call
# to return results below 2^-126 unflushed; in softmax and attention they are probabilities beside a row sum >= 1, or
# rescale factors of sums that small, so 0 is as good. (SASS, the d64 wgmma attention loop: 449 -> 347 instructions.)
EX2_SRC = '__forceinline__ __device__ float tvmpipe_ex2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }'


def ex2(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """2^x in float32 on the GPU through ``EX2_SRC`` (results below 2^-126 are 0)."""
    return T.cuda.func_call("tvmpipe_ex2", x, source_code=EX2_SRC, return_type="float32")


def padded_conv_input(data: te.Tensor, kh: int, kw: int, strides, padding, dilation) -> tuple:
    """An NCHW conv's zero-padded input and geometry: (data, (oh, ow), (sh, sw), (dh, dw))."""
    h, w = data.shape[2], data.shape[3]
    (sh, sw), (dh, dw) = [int(s) for s in strides], [int(d) for d in dilation]
    pt, pl, pb, pr = (int(p) for p in padding)
    if pt or pl or pb or pr:
        data = topi.nn.pad(data, [0, 0, pt, pl], [0, 0, pb, pr], name="pad_temp")
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (w + pl + pr - (kw - 1) * dw - 1) // sw + 1
    return data, (oh, ow), (sh, sw), (dh, dw)


def count_nodes(node, kind: type, pred: Callable | None = None) -> int:
    """How many ``kind`` nodes under ``node`` (a TIR statement or expression) satisfy ``pred`` (all if None)."""
    count = 0

    def visit(n) -> None:
        nonlocal count
        count += pred is None or bool(pred(n))

    tvm_ffi.structural_walk(node, [(kind, visit)], order="post")
    return count


def any_node(node, kind: type, pred: Callable) -> bool:
    """Whether a ``kind`` node under ``node`` satisfies ``pred``."""
    return count_nodes(node, kind, pred) > 0


def uses(expr, var: tirx.Var) -> bool:
    """Whether ``expr`` mentions ``var``."""
    return any_node(expr, tirx.Var, lambda v: v.same_as(var))


def substitute(expr, vmap: dict):
    """``expr`` with the variables in ``vmap`` replaced by their values."""
    return tvm_ffi.structural_map(expr, [(tirx.Var, lambda v: vmap.get(v, v))])


def sm_version(target: Target) -> int:
    """The CUDA target's compute capability as a number (``sm_90`` and ``sm_90a`` -> 90; 80 if the target names none)."""
    return cuda_arch(str(target.attrs.get("arch", "sm_80")))[0]


def has_wgmma(target: Target) -> bool:
    """Whether ``target`` has Hopper's warpgroup MMA (``sm_90a``: wgmma exists only in the arch-specific ISA)."""
    return sm_version(target) >= 90 and cuda_arch(str(target.attrs["arch"]))[1] == "a"


def wgmma_desc(sbase, off, lbo: int, sbo: int, swizzle: bool):
    """wgmma shared-memory matrix descriptor of the 2-byte-element tile at element ``off`` of the shared window at
    ``sbase``: leading / stride byte offsets ``lbo`` / ``sbo``, the 128-byte swizzle or none (the PTX ISA's layout)."""
    addr = T.Cast("uint64", ((sbase + T.Cast("uint32", off * 2)) >> T.uint32(4)) & T.uint32(0x3FFF))
    return addr | T.uint64((lbo >> 4) << 16 | (sbo >> 4) << 32 | (1 << 62 if swizzle else 0))


def register_split(threads: int, computing_warpgroups: int) -> tuple[int, int, int]:
    """Registers a thread (the CTA's even share, a computing warp's, the producer's) for ``setmaxnreg`` in a
    warp-specialised CTA of ``threads``: it starts with the even share (ptxas's most under __launch_bounds__(threads,
    1)); the producer warpgroup gives its registers up (down to 24 a thread), the computing warpgroups take them (up to
    240; FA3's split), and no warp can take more than the others have given (it would wait forever)."""
    even = 65536 // threads // 8 * 8
    computing = (even * (computing_warpgroups + 1) - 24) // max(computing_warpgroups, 1) // 8 * 8
    consumer = min(240, computing)
    return even, consumer, even * (computing_warpgroups + 1) - computing_warpgroups * consumer


@T.macro
def mbarrier_wait(done, addr, parity):
    """Spin until the mbarrier at shared-window address ``addr`` has completed the phase of ``parity`` (``done``: a
    one-element local flag)."""
    done[0] = T.uint32(0)
    while done[0] == T.uint32(0):
        T.ptx["mbarrier.try_wait.parity.shared::cta.b64"](done[0], addr, T.Cast("uint32", parity))


# A register pin: an empty asm that claims to rewrite the register, so the compiler keeps every use of it after
# the wgmma wait that precedes the pin (TVM's wgmma_noop_barrier takes its operand by value, pinning a copy).
# Uses hoisted above the wait make ptxas serialise all wgmma of the kernel (CUTLASS's warpgroup_fence_operand).
_PIN_SOURCE = {t: f'__forceinline__ __device__ void tvmpipe_pin_{t}({t}& r) {{ asm volatile("" : "+{c}"(r) :: "memory"); }}'
               for t, c in (("float", "f"), ("uint", "r"))}


@T.inline
def pin(buf, n, ctype):
    """Pin registers ``buf[:n]`` of C type ``ctype`` ("float" / "uint") at this point of the kernel."""
    for i in T.unroll(n):
        T.evaluate(T.cuda.func_call(f"tvmpipe_pin_{ctype}", buf[i], source_code=_PIN_SOURCE[ctype]))


def warp_shuffle_xor(value: tirx.PrimExpr, lane_mask) -> tirx.PrimExpr:
    """``value`` of the lane whose index differs from this lane's by ``lane_mask`` (XOR), all 32 lanes taking part."""
    return tvm_warp_shuffle_xor(tirx.const(0xFFFFFFFF, "uint32"), value, lane_mask, 32, 32)


TC_DTYPES = {"float16": "fp16", "bfloat16": "bf16"}  # tensor-core operand types, as mma.sync names them
SMEM_BYTES = 227 * 1024  # shared memory one CTA may take on sm_90


def mma_ops(dtype: str) -> tuple:
    """TVMScript macros of the mma.sync attention kernels' two tensor-core steps for ``dtype`` operands:
    ``ldmatrix(trans, frag, frag_off, smem, smem_off)`` (four 8x8 matrices) and ``mma(a, a_off, b, b_off, c, c_off)``
    (m16n8k16, fp32 accumulators); fragment layouts in ``attention_cuda``'s docstring."""
    ab = TC_DTYPES[dtype]

    @T.macro
    def ldmatrix(trans, frag, frag_off, smem, smem_off):
        T.ptx_legacy.ldmatrix(trans, 4, ".b16", frag.data, frag_off, smem.access_ptr("r"), smem_off, dtype=dtype)

    @T.macro
    def mma(a, a_off, b, b_off, c, c_off):
        T.ptx_legacy.mma("m16n8k16", "row", "col", ab, ab, "fp32", a.data, a_off, b.data, b_off, c.data, c_off, False,
                         dtype="float32")

    return ldmatrix, mma


def row_copier(cpr: int, at: Callable, core_matrices: bool = False, index: Callable = lambda *i: list(i)):
    """TVMScript macro ``load_rows(smem, base, src, b, row0, nrows, head, rows, tx, nt)``: cp.async ``rows`` rows
    src[b, row0 + r, head, :] of ``cpr`` 16-byte chunks into the shared tile at ``base``, element (r, col) at
    ``at(base, r, col, rows)``, zero past row ``nrows``, by the ``nt`` threads numbered ``tx``. ``core_matrices``: 8
    neighbouring lanes fill one 128-byte core matrix (8 rows' 16 bytes: wgmma's unswizzled layout) in one store
    wavefront; else they copy 128 contiguous bytes of a row. ``index(b, row, head, col)``: src's index of that element
    (another layout: a KV cache's [batch, heads, seq, dim])."""

    @T.macro
    def load_rows(smem, base, src, b, row0, nrows, head, rows, tx, nt):
        for it in T.unroll((rows * cpr + nt - 1) // nt):
            cid = T.meta_var(it * nt + tx)
            r = T.meta_var(cid // (8 * cpr) * 8 + cid % 8 if core_matrices else cid // cpr)
            col = T.meta_var(cid // 8 % cpr * 8 if core_matrices else cid % cpr * 8)
            if (it + 1) * nt <= rows * cpr or cid < rows * cpr:  # the last round may be partial
                T.ptx["cp.async.cg.shared.global"](
                    smem.ptr_to([at(base, r, col, rows)]),
                    src.ptr_to(index(b, T.min(row0 + r, nrows - 1), head, col)),
                    16,
                    T.Cast("uint32", T.if_then_else(row0 + r < nrows, 16, 0)),
                )

    return load_rows
