"""WriteOutputShape: a function output that only reshapes a kernel's result is written by that kernel directly.

TVM makes a reshape kernel a view (``RewriteDataflowReshape``) only inside a dataflow block: one that computes an
output of ``main`` stays a copy kernel (a launch, a read and a write of the whole output), since a view of a tensor
that memory planning may hand to another kernel cannot leave the function. A decoding step's attention ends so
(its [batch, seq, heads, dim] result reshaped to [batch, seq, hidden] as the model's output): the copy was a third
launch beside the attention kernel's two. Here the producing kernel's output parameter takes the reshaped shape and
its body reads that buffer through a view of the old shape (``T.decl_buffer(data=...)``): the generated code is the
same, the copy kernel goes.

It runs after scheduling (``pipeline.schedule``): the rules and the tuning log see the kernels as fusion made them.
"""

from __future__ import annotations

import math
from collections import Counter

import tvm
from tvm import relax, s_tir, tirx

from .util import dtype, static_shape, users

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _call_tir(expr: relax.Expr | None) -> relax.Call | None:
    """``expr`` if it is a ``call_tir`` without symbolic-shape arguments (its output the kernel's last parameter)."""
    ok = isinstance(expr, relax.Call) and expr.op.same_as(_CALL_TIR) and len(expr.args) == 2
    return expr if ok else None


def with_output_shape(func: tirx.PrimFunc, shape) -> tirx.PrimFunc:
    """``func`` (a root block: every scheduled kernel) whose output, its last parameter, has ``shape`` (as many
    elements, row-major), its body writing the old shape through a view declared at the top of the root block."""
    old, root = func.params[-1], func.body
    new = tirx.decl_buffer(shape, old.dtype, name=old.name, layout=old.layout)
    b = root.block
    block = s_tir.SBlock(b.iter_vars, b.reads, b.writes, b.name_hint,
                         tirx.SeqStmt([tirx.DeclBuffer(old, data=new.data), b.body]), b.init, b.alloc_buffers,
                         b.match_buffers, b.annotations)
    body = s_tir.SBlockRealize(root.iter_values, root.predicate, block)
    return tirx.PrimFunc([*func.params[:-1], new], body, func.ret_type, func.attrs)


def _same_size(a: relax.Expr, b: relax.Expr) -> bool:
    """Two statically shaped tensors of one dtype and as many elements. (A symbolic dimension of ``main`` is not the
    kernel's own variable of that name: such outputs stay copies.)"""
    shapes = static_shape(a), static_shape(b)
    return None not in shapes and dtype(a) == dtype(b) and math.prod(shapes[0]) == math.prod(shapes[1])


def write_output_shape(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[str]]:
    """Fold every output reshape of ``main`` that can be (see the module docstring) into its producer; return the
    module and the names of the reshape kernels no longer launched."""
    main = mod["main"]
    calls: Counter = Counter()  # kernel -> its call sites (one with shape arguments counts twice: never rewritten)

    def count(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call) and expr.op.same_as(_CALL_TIR):
            calls[expr.args[0].name_hint] += 1 if _call_tir(expr) is not None else 2

    relax.analysis.post_order_visit(main, count)
    readers, found = users(main), {}  # reshape binding's var -> (its source, the producer's call)
    for block in main.body.blocks:
        value = {b.var: b.value for b in block.bindings}
        for binding in block.bindings:
            call = _call_tir(binding.value)
            source = call.args[1].fields[0] if call is not None and len(call.args[1].fields) == 1 else None
            producer = _call_tir(value.get(source)) if isinstance(source, relax.DataflowVar) else None
            if (producer is not None and not isinstance(binding.var, relax.DataflowVar) and readers[source] == 1
                    and len(mod[call.args[0]].params) == 2 and relax.analysis.has_reshape_pattern(mod[call.args[0]])
                    and calls[producer.args[0].name_hint] == 1 and _same_size(source, binding.var)
                    and len(mod[producer.args[0]].params) == len(producer.args[1].fields) + 1
                    and isinstance(mod[producer.args[0]].body, s_tir.SBlockRealize)):
                found[binding.var] = (source, producer, call.args[0].name_hint)
    if not found:
        return mod, []
    bb = relax.BlockBuilder(mod.clone())
    new_call = {}
    for var, (_, producer, _) in found.items():  # the producer as a new function: its GlobalVar carries its type
        name = producer.args[0].name_hint
        func = with_output_shape(mod[name], static_shape(var))
        del bb.get()[name]
        new_call[var] = relax.call_tir(bb.add_func(func, name), producer.args[1], var.ty)
    drop = {source for source, _, _ in found.values()}
    blocks = [type(block)([relax.VarBinding(b.var, new_call[b.var]) if b.var in new_call else b
                           for b in block.bindings if b.var not in drop]) for block in main.body.blocks]
    bb.update_func(bb.get().get_global_var("main"), relax.Function(
        main.params, relax.SeqExpr(blocks, main.body.body), main.ret_ty, main.is_pure, main.attrs))
    out, called = relax.transform.Normalize()(bb.get()), set()
    for func in out.functions.values():  # (a reshape kernel may have other callers)
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, lambda e: isinstance(e, tvm.ir.GlobalVar) and called.add(e.name_hint))
    folded = [name for _, _, name in found.values()]
    for name in set(folded) - called:
        del out[name]
    return out, folded
