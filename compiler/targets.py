"""Turn a target name (a file in ``targets/``) or a path to such a JSON file into a TVM Target.

A target file holds ``{"description": str, "target": <TVM target dict>}``. For CPU targets the values
``"host"`` of ``mcpu`` and ``num-cores`` are filled in from this machine, so ``cpu`` always means "the
CPU this runs on"; the detected ISA is recorded so a package refuses to load on a CPU that lacks it.
A CUDA target file may also say ``"sms": N``, the GPU's SM count, which TVM's target does not carry and the
kernels' launch plans depend on (the persistent attention grid, the split softmax's blocks, which must all be
resident); without it, ``DEFAULT_SMS`` of the arch.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import TvmpipeError

# SM count by compute capability where a target file does not give one: the H100 / H200 SXM's and the A100's (an
# H100 PCIe has 114, an H20 78: their target files should say so).
DEFAULT_SMS = {90: 132, 80: 108}
# Vector extensions worth naming in a summary (LLVM feature names), widest first.
_ISA_NAMES = ("amx-tile", "avx512f", "avx2", "avx", "sse4.2", "neon", "sve")


@dataclass(frozen=True)
class TargetInfo:
    """What the pipeline needs to know about a target, plus the TVM ``Target`` itself."""

    name: str
    description: str
    spec: dict[str, Any]  # the TVM target dict after host detection
    kind: str  # "cpu" or "cuda"
    arch: str | None = None  # "sm_90" for CUDA
    sms: int | None = None  # CUDA: the SMs the kernels are planned for (the file's "sms", else DEFAULT_SMS)
    cores: int = 1
    cpu_features: tuple[str, ...] = field(default_factory=tuple)

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"

    @property
    def target(self):  # -> tvm.target.Target (import kept lazy: listing targets needs no TVM)
        import tvm

        return tvm.target.Target(self.spec)

    def isa_summary(self) -> str:
        """e.g. 'znver5, AVX-512, 2 cores' or 'sm_90a, 132 SMs'."""
        if self.is_gpu:
            return f"{self.arch or 'cuda'}, {self.sms} SMs" if self.sms else self.arch or "cuda"
        isa = next((n for n in _ISA_NAMES if n in self.cpu_features), "scalar")
        pretty = {"amx-tile": "AMX + AVX-512", "avx512f": "AVX-512"}.get(isa, isa.upper())
        return f"{self.spec.get('mcpu', 'generic')}, {pretty}, {self.cores} cores"


def cuda_arch(arch: str) -> tuple[int, str]:
    """``sm_90a`` -> (90, "a"): the compute capability and the suffix. "a" is arch-specific (wgmma: that GPU only),
    "f" family-specific; both only unlock instructions on the same silicon."""
    name = arch.removeprefix("sm_")
    number = name.rstrip("af")
    return int(number), name[len(number):]


def default_sms(arch: str | None) -> int | None:
    """``DEFAULT_SMS`` of a CUDA arch (``sm_90a``), None for an arch it does not list or no arch."""
    try:
        return DEFAULT_SMS.get(cuda_arch(arch)[0]) if arch else None
    except ValueError:
        return None


def target_dir() -> Path:
    return Path(str(resources.files("targets")))


def names() -> list[str]:
    """Names of the bundled targets."""
    return sorted(p.stem for p in target_dir().glob("*.json"))


def _host_cpu_features(mcpu: str) -> tuple[str, ...]:
    import tvm
    from tvm.target import codegen

    return tuple(sorted(codegen.llvm_get_cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))))


def resolve(name_or_path: str) -> TargetInfo:
    """Resolve ``cpu`` / ``cuda-sm90`` / ``path/to/target.json`` into a TargetInfo."""
    path = Path(name_or_path)
    if name_or_path.endswith(".json") or os.sep in name_or_path:
        if not path.is_file():
            raise TvmpipeError(f"target file not found: {name_or_path}")
        name = path.stem
    else:
        path = target_dir() / f"{name_or_path}.json"
        if not path.is_file():
            raise TvmpipeError(
                f"unknown target '{name_or_path}' (known: {', '.join(names())}; or pass a path to a target .json)"
            )
        name = name_or_path
    try:
        data = json.loads(path.read_text())
        spec = dict(data["target"])
        kind_name = spec["kind"]
    except (ValueError, KeyError, TypeError) as err:
        raise TvmpipeError(f"target file {path} is not valid: {err!r} (expected {{'target': {{'kind': ...}}}})") from err

    if kind_name == "llvm":
        from tvm.target import codegen

        if spec.get("mcpu", "host") == "host":
            spec["mcpu"] = codegen.llvm_get_system_cpu()
        if spec.get("num-cores", "host") == "host":
            spec["num-cores"] = len(os.sched_getaffinity(0))
        info = TargetInfo(
            name=name,
            description=data.get("description", ""),
            spec=spec,
            kind="cpu",
            cores=int(spec["num-cores"]),
            cpu_features=_host_cpu_features(spec["mcpu"]),
        )
    elif kind_name == "cuda":
        arch = spec.get("arch")
        sms = data.get("sms", default_sms(arch))
        if sms is not None and (not isinstance(sms, int) or isinstance(sms, bool) or sms < 1):
            raise TvmpipeError(f"target file {path}: \"sms\" must be the GPU's SM count, a positive integer, "
                               f"not {sms!r}")
        info = TargetInfo(
            name=name, description=data.get("description", ""), spec=spec, kind="cuda", arch=arch, sms=sms
        )
    else:
        raise TvmpipeError(f"target file {path}: kind '{kind_name}' is not supported (llvm or cuda)")
    try:
        info.target  # validate now, with the file named, rather than deep inside the build
    except Exception as err:  # TVM raises its own error types for bad attributes
        raise TvmpipeError(f"target file {path} is not a valid TVM target: {err}") from err
    return info


# /proc/cpuinfo flags that change which instructions compiled code may use; a CPU package records the
# builder's and refuses to load where one is missing (rather than dying of SIGILL).
_ISA_FLAGS = (
    "sse4_1", "sse4_2", "popcnt", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "adx",
    "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512ifma", "avx512vbmi", "avx512_vbmi2",
    "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx512_bitalg", "avx512_vpopcntdq", "avx_vnni",
    "amx_tile", "amx_int8", "amx_bf16", "gfni", "vaes", "vpclmulqdq",
)


def host_cpu_flags() -> list[str]:
    """The ISA-relevant CPU flags of this machine (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return [f for f in _ISA_FLAGS if f in flags]
    return []


def use_all_cpus() -> None:
    """Let TVM's thread pool use every CPU this process may run on, unpinned, unless ``TVM_NUM_THREADS`` /
    ``TVM_BIND_THREADS`` say otherwise.

    TVM's default takes half of the CPUs (it assumes two hyper-threads per core): on this project's 2-core
    machines every parallel kernel ran on one thread, while onnxruntime used both (measured: a 64x50257
    softmax 0.92 ms -> 0.38 ms). And it pins each thread to a core: with another process busy on one core, the
    demo model took 3.5 ms instead of 0.11 (unpinned). The pool reads both variables when it starts, at the
    first parallel kernel, so importing ``compiler`` calls this; tuning's runner processes inherit them.
    """
    os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    os.environ.setdefault("TVM_BIND_THREADS", "0")
