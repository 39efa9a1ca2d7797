"""Ship compiled GPU code: turn the CUDA source TVM leaves in a module into cubin (+ PTX) at build time.

TVM 0.27 built without a GPU keeps CUDA *source* in the exported library and compiles it when the
library is loaded (Python + NVRTC needed there). We compile it here with NVRTC instead and rewrite the
serialized CUDA module to hold the binary, so loading needs only the CUDA driver.

Why hand-written: TVM has no API to swap a serialized module's payload. The two formats touched are
small and fixed: tvm-ffi's library blob ``<nbytes:u64> <indptr:vec<u64>> <children:vec<u64>>
(<kind:str> [<bytes:str>])*`` and the CUDA module's ``<fmt:str> <fmap> <code:str>``; each str/vec is a
u64 length followed by the payload.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .errors import TvmpipeError


@dataclass
class GpuCode:
    """What the package holds for the GPU: format and the images inside it."""

    format: str  # "fatbin" (cubin + PTX) or "cubin"
    images: list[str]  # e.g. ["sm_90 cubin", "compute_90 ptx"]
    nbytes: int


def _u64(b: bytes, pos: int) -> tuple[int, int]:
    return struct.unpack_from("<Q", b, pos)[0], pos + 8


def _str(b: bytes, pos: int) -> tuple[bytes, int]:
    n, pos = _u64(b, pos)
    return b[pos : pos + n], pos + n


def _pack_str(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def cuda_toolkit_root() -> Path:
    """Where NVRTC finds the CUDA headers: $CUDA_PATH / $CUDA_HOME, else the toolkit of ``nvcc``."""
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            return Path(os.environ[var])
    nvcc = shutil.which("nvcc")
    for root in ([Path(nvcc).resolve().parent.parent] if nvcc else []) + [Path("/usr/local/cuda")]:
        if (root / "include" / "cuda_fp16.h").is_file():
            return root
    raise TvmpipeError(
        "building for a CUDA target needs the CUDA 13 headers: set CUDA_PATH to a CUDA toolkit root "
        "(and install tvmpipe[cuda] for NVRTC)"
    )


@contextmanager
def exact_math() -> Iterator[None]:
    """CUDA compiled inside this context is compiled without fast math, whichever way TVM compiles it.

    TVM's NVRTC path always passes ``--use_fast_math`` (no option turns it off) and its nvcc path does
    unless ``TVM_CUDA_NVCC_NO_FAST_MATH`` is set. Fast math swaps the math library for the hardware
    approximations: ``powf`` becomes ``__powf`` (exp2(y * log2 x): NaN for every negative base, so
    GPT-2's ``pow(x, 3)`` GELU gave NaN on the H200), ``sinf`` ``__sinf`` (wrong for large arguments),
    ``tanhf`` ``tanh.approx``, and division and sqrt round loosely. Results must match the ONNX model, so
    the flag is filtered out of NVRTC's options; the hand-written kernels use ``exp2`` (one instruction
    either way) where speed needs it. Used around our own compile (``compile_source``) and around
    ``tvm.compile`` (a TVM that finds its CUDA compile callback registered compiles there, not here).
    """
    saved_env = os.environ.get("TVM_CUDA_NVCC_NO_FAST_MATH")
    os.environ["TVM_CUDA_NVCC_NO_FAST_MATH"] = "1"
    try:
        from cuda.bindings import nvrtc
    except ImportError:  # no NVRTC: nothing compiles through it (compile_source reports the missing package)
        nvrtc = None
    if nvrtc is not None:
        compile_program = nvrtc.nvrtcCompileProgram

        def exact(prog, _n: int, options: list[bytes]):
            kept = [o for o in options if o != b"--use_fast_math"]
            return compile_program(prog, len(kept), kept)

        nvrtc.nvrtcCompileProgram = exact
    try:
        yield
    finally:
        if nvrtc is not None:
            nvrtc.nvrtcCompileProgram = compile_program
        if saved_env is None:
            os.environ.pop("TVM_CUDA_NVCC_NO_FAST_MATH", None)
        else:
            os.environ["TVM_CUDA_NVCC_NO_FAST_MATH"] = saved_env


def compile_source(source: str, arch: str) -> tuple[bytes, GpuCode]:
    """CUDA C++ -> a fatbin holding sm_XX cubin + compute_XX PTX (cubin alone without ``fatbinary``)."""
    os.environ.setdefault("CUDA_PATH", str(cuda_toolkit_root()))
    try:
        from tvm.support import nvcc
    except ImportError as err:  # pragma: no cover - part of the TVM wheel
        raise TvmpipeError(f"TVM's CUDA compiler support is missing: {err}") from err
    try:
        with exact_math():
            cubin = bytes(nvcc.compile_cuda(source, target_format="cubin", arch=arch, compiler="nvrtc"))
            ptx = bytes(nvcc.compile_cuda(source, target_format="ptx", arch=arch, compiler="nvrtc"))
    except ImportError as err:
        raise TvmpipeError(f"NVRTC is not installed ({err}): pip install 'tvmpipe[cuda]'") from err
    sm = arch.removeprefix("sm_")
    fatbinary = shutil.which("fatbinary") or shutil.which(str(cuda_toolkit_root() / "bin" / "fatbinary"))
    if not fatbinary:
        return cubin, GpuCode("cubin", [f"sm_{sm} cubin"], len(cubin))
    with tempfile.TemporaryDirectory() as tmp:
        c, p, f = (Path(tmp) / n for n in ("k.cubin", "k.ptx", "k.fatbin"))
        c.write_bytes(cubin)
        p.write_bytes(ptx)
        subprocess.run(
            [fatbinary, "--64", f"--create={f}", f"--image3=kind=elf,sm={sm},file={c}",
             f"--image3=kind=ptx,sm={sm},file={p}"],
            check=True, capture_output=True,
        )
        fat = f.read_bytes()
    return fat, GpuCode("fatbin", [f"sm_{sm} cubin", f"compute_{sm} ptx"], len(fat))


def _patch_cuda_module(payload: bytes, arch: str, sources: list[str]) -> tuple[bytes, GpuCode | None]:
    fmt, pos = _str(payload, 0)
    if fmt != b"cuda":  # already binary
        return payload, None
    # <code> is the last field and equals the module's source text; <fmap> sits between <fmt> and it.
    for source in sources:
        code = source.encode()
        if payload.endswith(_pack_str(code)):
            fmap = payload[pos : len(payload) - len(code) - 8]
            binary, info = compile_source(source, arch)
            return _pack_str(info.format.encode()) + fmap + _pack_str(binary), info
    raise RuntimeError("CUDA module payload does not end with its source: TVM's module format changed")


def patch_library_blob(blob: bytes, arch: str, sources: list[str]) -> tuple[bytes, GpuCode | None]:
    """Rewrite every CUDA source module inside a tvm-ffi library blob to hold compiled code.

    ``sources`` are the CUDA sources of the modules (``inspect_source("cuda")``).
    """
    (nbytes, pos) = _u64(blob, 0)
    body_start = pos
    nindptr, pos = _u64(blob, pos)
    pos += 8 * nindptr
    nchild, pos = _u64(blob, pos)
    pos += 8 * nchild
    out = [blob[body_start:pos]]
    info = None
    for _ in range(nindptr - 1):
        kind, pos = _str(blob, pos)
        out.append(_pack_str(kind))
        if kind == b"_lib":
            continue
        payload, pos = _str(blob, pos)
        if kind == b"cuda":
            payload, info = _patch_cuda_module(payload, arch, sources)
        out.append(_pack_str(payload))
    assert pos == body_start + nbytes, "library blob length mismatch"
    body = b"".join(out)
    return struct.pack("<Q", len(body)) + body, info


def compiled_imports(target, arch: str, found: list[GpuCode]) -> Callable:
    """An ``export_library`` ``fpack_imports`` that packs a library's imported modules with each CUDA source
    module compiled here, exactly (``compile_source``); ``found`` receives what was compiled."""

    def pack(mod, _is_system_lib: bool, _prefix: str, workspace_dir: str) -> str:
        from tvm.runtime import _ffi_api

        blob = _ffi_api.ModulePackImportsToTensor(mod).numpy().tobytes()
        sources = [m.inspect_source("cuda") for m in mod._collect_from_import_tree(lambda m: m.kind == "cuda")]
        with target:
            blob, info = patch_library_blob(blob, arch, sources)
        found.extend([info] if info else [])
        return str(blob_object(blob, Path(workspace_dir)))

    return pack


def blob_object(blob: bytes, workdir: Path) -> Path:
    """An object file defining ``__tvm_ffi__library_bin`` = blob (``.incbin``: fast for any size)."""
    from tvm.support import cc

    bin_path, asm_path, obj_path = workdir / "devc.bin", workdir / "devc.S", workdir / "devc.o"
    bin_path.write_bytes(blob)
    asm_path.write_text(
        ".section .rodata\n.global __tvm_ffi__library_bin\n.type __tvm_ffi__library_bin, @object\n"
        f".balign 16\n__tvm_ffi__library_bin:\n.incbin \"{bin_path}\"\n"
        ".size __tvm_ffi__library_bin, .-__tvm_ffi__library_bin\n"
        '.section .note.GNU-stack,"",@progbits\n'
    )
    subprocess.run([cc.get_cc() or "gcc", "-c", "-fPIC", "-o", str(obj_path), str(asm_path)], check=True)
    return obj_path
