"""tvmpipe: ONNX -> TVM Relax -> one deployable package.

The public API is small and lazily imported, so ``compiler.load`` works with TVM's runtime alone:

    compiler.compile_model("model.onnx", "cpu", "model.tvmpkg", shapes={"x": (1, 3, 224, 224)})
    run = compiler.load("model.tvmpkg"); outputs = run(x=array)
"""

from .errors import TvmpipeError
from .targets import use_all_cpus
from .version import __version__

use_all_cpus()  # before anything (constant folding at compile time included) starts TVM's thread pool

__all__ = ["TvmpipeError", "__version__", "compile_model", "load", "register_op"]


def load(path: str):
    """Load a ``.tvmpkg``; see ``compiler.runtime.Runner``."""
    from .runtime import load as _load

    return _load(path)


def compile_model(*args, **kwargs) -> dict:
    """Compile an ONNX file into a package; see ``compiler.pipeline.compile_model``."""
    from .pipeline import compile_model as _compile

    return _compile(*args, **kwargs)


def register_op(*args, **kwargs):
    """Add a custom ONNX op (converter, shape check, schedules); see ``compiler.plugins.register_op``."""
    from .plugins import register_op as _register

    return _register(*args, **kwargs)
