"""The Relax ONNX importer with tvmpipe's converters and error context.

The upstream importer knows op types only, not domains, so custom-domain nodes are renamed to
``domain::OpType`` before import; this subclass routes those (and our ONNX overrides such as LSTM) to
``registry`` and wraps every converter failure into one error that names the node.
"""

from __future__ import annotations

import contextlib
import io

import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as upstream

from ..errors import TvmpipeError
from . import registry
from .support import ONNX_DOMAINS


def qualified_op(domain: str, op_type: str) -> str:
    return op_type if domain in ONNX_DOMAINS else f"{domain}::{op_type}"


def _split(op_name: str) -> tuple[str, str]:
    domain, sep, op = op_name.rpartition("::")
    return (domain, op) if sep else ("", op_name)


def is_supported(domain: str, op_type: str) -> bool:
    if registry.lookup(domain, op_type) is not None:
        return True
    return domain in ONNX_DOMAINS and (op_type in upstream._get_convert_map() or op_type in ("If", "Constant"))


class _Importer(upstream.ONNXGraphImporter):
    def _check_for_unsupported_ops(self, graph: onnx.GraphProto) -> None:
        """Done earlier by ``support.check``, over subgraphs too and with node names."""

    def _convert_operator(self, op_name: str, inputs: list, attrs: dict, opset: int) -> relax.Expr:
        node = attrs.get("tvm_custom", {}).get("name") or "<unnamed>"
        try:
            conv = registry.lookup(*_split(op_name))
            if conv is None:
                return super()._convert_operator(op_name, inputs, attrs, opset)
            sym = registry.as_function(conv, opset)(self.bb, inputs, attrs, [self._nodes, self._params])
            return self.bb.normalize(sym) if isinstance(sym, relax.Expr) else sym
        except TvmpipeError:
            raise
        except Exception as err:  # upstream converters raise anything from KeyError to TVMError
            msg = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            raise TvmpipeError(f"cannot import node '{node}' ({op_name}, opset {opset}): {msg}") from err


@relax.transform.function_pass(opt_level=0, name="ClipTakes")
def clip_takes(func: relax.Function, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> relax.Function:
    """Every ``take`` in "clip" mode (indices clamped to the axis), not the importer's "fast" (unchecked).

    The importer has already made ONNX's negative indices positions, so valid indices read the same elements;
    an invalid one that the runtime's input checks cannot see (a computed index) reads an edge row instead of
    outside the buffer. And TVM logs "Fast mode segfaults when there are out-of-bounds indices" from C++ at
    every legalisation of a fast take (FoldConstant legalises too): raw log lines in every user's compile.
    """
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    def rewrite(call: relax.Call, _) -> relax.Expr:
        if str(call.attrs.mode) != "fast":
            return call
        return relax.op.take(call.args[0], call.args[1], call.attrs.axis, mode="clip")

    return rewrite_call(is_op("relax.take")(wildcard(), wildcard()), rewrite, func)


def import_model(model: onnx.ModelProto, opset: int, shapes: dict[str, list[int]], dtypes: dict[str, str]):
    """ONNX -> Relax IRModule with weights as constants."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for node in model.graph.node:
        if node.domain not in ONNX_DOMAINS:
            node.op_type = qualified_op(node.domain, node.op_type)
    importer = _Importer(shapes, dtypes, keep_params_in_input=False, sanitize=True)
    # The upstream importer prints the failing op's inputs to stdout before re-raising; keep stdout clean.
    with contextlib.redirect_stdout(io.StringIO()):
        return clip_takes(importer.from_onnx(model.graph, opset))
