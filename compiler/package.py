"""Package stage: one ``.tvmpkg`` file = a zip of ``manifest.json`` + ``model.so`` (code and weights).

The weights live in the library itself (the VM executable's constant pool), so a package is
self-contained. ``save`` writes atomically: a crash never leaves a half-written file at the path.
Inputs frozen at compile time (``--bind-input``) are also kept, as ``bound_inputs.npz``: the runtime
checks a fed value against them, and ``bench --compare-onnx`` feeds them to onnxruntime.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .errors import TvmpipeError

if TYPE_CHECKING:  # the runtime side imports this module and must not pull in TVM's compiler
    from .build import Built

MANIFEST = "manifest.json"
LIBRARY = "model.so"
BOUND = "bound_inputs.npz"


def array_digest(a: np.ndarray) -> str:
    """sha256 of an array's dtype, shape and bytes (C order): how the manifest names a bound value."""
    a = np.ascontiguousarray(a)
    return hashlib.sha256(f"{a.dtype.str}{list(a.shape)}".encode() + a.tobytes()).hexdigest()


def save(path: str | Path, built: "Built", manifest: dict, bound: dict[str, np.ndarray] | None = None) -> dict:
    """Export ``built`` and write the package (with the ``bound`` input values, if any); return the manifest as
    written (with GPU code info)."""
    path = Path(path)
    if path.is_dir():
        raise TvmpipeError(f"output path is a directory: {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp) / LIBRARY
        gpu = built.export(lib)
        manifest = dict(manifest)
        if gpu is not None:
            manifest["gpu_code"] = {"format": gpu.format, "images": gpu.images, "bytes": gpu.nbytes}
        fd, partial = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
        os.close(fd)
        try:
            with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as zf:
                zf.writestr(MANIFEST, json.dumps(manifest, indent=2))
                zf.write(lib, LIBRARY)
                if bound:
                    buf = io.BytesIO()
                    np.savez(buf, **bound)
                    zf.writestr(BOUND, buf.getvalue())
            os.replace(partial, path)
        except BaseException:
            Path(partial).unlink(missing_ok=True)
            raise
    return manifest


def read_manifest(path: str | Path) -> dict:
    """The manifest of a package, with a clear error for anything that is not one."""
    path = Path(path)
    if not path.is_file():
        raise TvmpipeError(f"package not found: {path}")
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            if MANIFEST not in names or LIBRARY not in names:
                raise TvmpipeError(f"{path} is not a tvmpipe package (no {MANIFEST} / {LIBRARY} inside)")
            return json.loads(zf.read(MANIFEST))
    except (zipfile.BadZipFile, EOFError, ValueError, zlib.error) as err:
        raise TvmpipeError(f"{path} is corrupt or not a tvmpipe package ({err})") from None


def extract_library(path: str | Path, dest_dir: str | Path) -> Path:
    """Unzip the library next to nothing else; CRC-checked by zipfile."""
    out = Path(dest_dir) / LIBRARY
    try:
        with zipfile.ZipFile(path) as zf:
            out.write_bytes(zf.read(LIBRARY))
    except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as err:  # zlib: damaged deflate stream
        raise TvmpipeError(f"{path} is corrupt: its library cannot be read ({err})") from None
    return out


def read_bound(path: str | Path, dtypes: dict[str, str]) -> dict[str, np.ndarray]:
    """The input values frozen into the package at compile time (empty if none), as the ``dtypes`` the
    manifest records (.npz keeps bfloat16 only as raw 2-byte records)."""
    try:
        with zipfile.ZipFile(path) as zf:
            if BOUND not in zf.namelist():
                return {}
            with np.load(io.BytesIO(zf.read(BOUND)), allow_pickle=False) as data:
                return {k: data[k].view(np.dtype(dtypes[k])) for k in data.files if k in dtypes}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, TypeError, zlib.error) as err:
        raise TvmpipeError(f"{path} is corrupt: its bound input values cannot be read ({err})") from None
