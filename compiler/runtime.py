"""Runtime stage: load a ``.tvmpkg`` with TVM's runtime alone and run it on numpy arrays by name.

Nothing here imports the compiler side of TVM (or onnx), so a deployment needs only ``tvm.runtime``.
Loading checks the manifest against this machine and this TVM first, and says what does not match.
Inputs frozen at compile time (``--bind-input``) may be left out; fed, they must equal the bound value.
"""

from __future__ import annotations

import tempfile
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import package
from .errors import TvmpipeError
from .targets import cuda_arch, host_cpu_flags
from .version import PACKAGE_FORMAT, __version__


@dataclass
class Timing:
    """Per-run latencies in milliseconds."""

    ms: list[float]

    def summary(self) -> dict[str, float]:
        a = np.asarray(self.ms)
        return {
            "mean_ms": float(a.mean()),
            "median_ms": float(np.median(a)),
            "p90_ms": float(np.percentile(a, 90)),
            "p99_ms": float(np.percentile(a, 99)),
            "min_ms": float(a.min()),
            "runs": len(a),
        }


def load_cuda_runtime() -> None:
    """Load TVM's CUDA runtime library; a runtime-only TVM does not (it autoloads backends only when
    its compiler is present), so without this no CUDA device exists there."""
    from pathlib import Path

    from tvm.base import _LOADED_LIBS
    from tvm_ffi.libinfo import load_lib_ctypes

    if "tvm_runtime_cuda" in _LOADED_LIBS:
        return
    lib_dir = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent
    try:
        _LOADED_LIBS["tvm_runtime_cuda"] = load_lib_ctypes(
            package="tvm", target_name="tvm_runtime_cuda", extra_lib_paths=[lib_dir], mode="RTLD_LOCAL"
        )
    except (OSError, RuntimeError) as err:  # no libcuda.so.1 (no driver) lands here
        raise TvmpipeError(f"TVM's CUDA runtime cannot be loaded: {err}") from None


def gpu_code_runs(arch: str, images: list[str], have: int) -> bool:
    """Whether a package's GPU code for ``arch`` (e.g. ``sm_90a``) runs on a GPU of compute capability ``have``
    (e.g. 90): its cubin on that SM; its PTX on later ones too, unless the arch is arch-specific (``a``: wgmma)."""
    sm, suffix = cuda_arch(arch)
    return have == sm or (have > sm and suffix != "a" and any("ptx" in i for i in images))


def sm_mismatch(target: dict, have: int) -> str | None:
    """Why a package planned for ``target["sms"]`` SMs runs below its best on a GPU of ``have``, or None."""
    planned = target.get("sms")
    if not planned or planned == have:
        return None
    return (f"{target['name']} plans its kernels for a GPU of {planned} SMs and this one has {have}: persistent "
            "attention kernels and split softmax rows size their grids by SM count (fewer SMs: part of the grid waits "
            f"for a second wave; more: SMs idle). Recompile with a target file that says \"sms\": {have}")


def _check_compatible(manifest: dict, path: str) -> None:
    import tvm

    if manifest.get("format") != "tvmpipe-package" or manifest.get("format_version") != PACKAGE_FORMAT:
        raise TvmpipeError(
            f"{path} has package format {manifest.get('format_version')!r}; this tvmpipe {__version__} "
            f"reads format {PACKAGE_FORMAT}: recompile the model"
        )
    built_with = manifest.get("tvm_version")
    if built_with != tvm.__version__:
        raise TvmpipeError(
            f"{path} was built with TVM {built_with} (tvmpipe {manifest.get('tvmpipe_version')}); this is "
            f"TVM {tvm.__version__}: recompile the model with this version"
        )
    target = manifest["target"]
    if target["kind"] == "cuda":
        try:
            load_cuda_runtime()
        except TvmpipeError as err:
            raise TvmpipeError(
                f"{path} is built for {target['name']} ({target['arch']}) but this machine has no CUDA GPU ({err})"
            ) from None
        dev = tvm.cuda(0)
        if not dev.exist:
            raise TvmpipeError(
                f"{path} is built for {target['name']} ({target['arch']}) but this machine has no CUDA GPU"
            )
        have = int(dev.compute_version.replace(".", ""))
        if not gpu_code_runs(target["arch"], manifest.get("gpu_code", {}).get("images", []), have):
            raise TvmpipeError(f"{path} holds GPU code for {target['arch']}, but this GPU is sm_{have}")
        slower = sm_mismatch(target, dev.multi_processor_count)
        if slower:
            warnings.warn(f"{path}: {slower}")
    else:
        missing = sorted(set(target.get("cpu_flags", [])) - set(host_cpu_flags()))
        if missing:
            raise TvmpipeError(
                f"{path} was compiled for a CPU with {', '.join(missing)}, which this CPU lacks: "
                "recompile it here with --target cpu"
            )


@dataclass
class KernelTime:
    """One kernel's share of a call of ``main``: where its schedule came from, launches and milliseconds."""

    name: str
    schedule: str  # the manifest's "tuned", "hand:<rule>", "dlight:<rule>" or "default"
    calls: int
    ms: float


def numpy_dtype(name: str) -> np.dtype:
    """A manifest dtype as numpy's: bfloat16, float8_e4m3fn, int4 ... are ml_dtypes' (which TVM's runtime
    imports, registering their names with numpy)."""
    import ml_dtypes  # noqa: F401

    return np.dtype(name)


def _as_spec(a: np.ndarray, spec: dict) -> np.ndarray:
    """An output as the manifest's dtype: a low-precision one comes back as its storage bytes."""
    return a.view(numpy_dtype(spec["dtype"])) if "storage" in spec else a


class Runner:
    """A loaded package: ``runner(**arrays) -> {output name: array}``."""

    def __init__(self, path: str):
        import tvm
        from tvm.runtime.vm import VirtualMachine

        self.path = path
        self.manifest = package.read_manifest(path)
        _check_compatible(self.manifest, path)
        self.inputs: list[dict] = self.manifest["inputs"]
        self.outputs: list[dict] = self.manifest["outputs"]
        self.bound_inputs: list[dict] = self.manifest.get("bound_inputs", [])
        self.bound_values: dict[str, np.ndarray] = package.read_bound(
            path, {b["name"]: b["dtype"] for b in self.bound_inputs}) if self.bound_inputs else {}
        if set(self.bound_values) != {b["name"] for b in self.bound_inputs}:
            raise TvmpipeError(f"{path} is corrupt: its manifest names bound inputs whose values it does not hold")
        self.device = tvm.cuda(0) if self.manifest["target"]["kind"] == "cuda" else tvm.cpu(0)
        with tempfile.TemporaryDirectory() as tmp:
            lib_path = package.extract_library(path, tmp)
            try:
                lib = tvm.runtime.load_module(str(lib_path))
            except Exception as err:  # the loader reports a damaged library as a TVM error
                raise TvmpipeError(f"{path}: its library does not load ({str(err).strip().splitlines()[-1]})") from err
        self._vm = VirtualMachine(lib, self.device)

    def _host_arrays(self, arrays: dict[str, np.ndarray], partial: bool = False) -> dict[str, np.ndarray]:
        """``arrays`` checked against the manifest, as the compiled code reads them (C order, low-precision types as
        their storage), by input name; one error lists every problem. ``partial``: inputs may be left out."""
        names = [i["name"] for i in self.inputs]
        problems = []
        missing = [] if partial else [n for n in names if n not in arrays]
        problems += [p for spec in self.bound_inputs if (p := self._check_bound(spec, arrays))]
        extra = sorted(set(arrays) - set(names) - set(self.bound_values))
        if missing:
            problems.append(f"missing input{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
        if extra:
            problems.append(f"unknown input{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))}")
        host = {}
        for spec in self.inputs:
            if spec["name"] not in arrays:
                continue
            a = np.asarray(arrays[spec["name"]])
            if list(a.shape) != spec["shape"]:
                problems.append(f"input '{spec['name']}' has shape {list(a.shape)}, expected {spec['shape']}")
            elif a.dtype.name != spec["dtype"]:
                problems.append(f"input '{spec['name']}' has dtype {a.dtype.name}, expected {spec['dtype']}")
            elif "index_range" in spec and a.size and not spec["index_range"][0] <= a.min() <= a.max() <= spec["index_range"][1]:
                lo, hi = spec["index_range"]
                where = np.argwhere((a < lo) | (a > hi))[0]
                problems.append(f"input '{spec['name']}' holds {a[tuple(where)]} at {list(map(int, where))}, outside "
                                f"[{lo}, {hi}], the indices that {spec['index_of']} can read")
            else:
                a = np.require(a, requirements="C")
                # float8/int4 ...: the compiled code reads the storage bytes
                host[spec["name"]] = a.view(spec["storage"]) if "storage" in spec else a
        if problems:
            expected = ", ".join(f"{i['name']}: {i['dtype']}{i['shape']}" for i in self.inputs) or "no inputs"
            raise TvmpipeError(f"{'; '.join(problems)} (the package expects {expected})")
        return host

    def _arguments(self, arrays: dict[str, np.ndarray]) -> list:
        """``main``'s arguments: every input checked and copied to the device."""
        import tvm

        host = self._host_arrays(arrays)
        return [tvm.runtime.tensor(host[spec["name"]], self.device) for spec in self.inputs]  # keeps 0-d arrays 0-d

    def _check_bound(self, spec: dict, arrays: dict[str, np.ndarray]) -> str | None:
        """Why a value fed for a bound input is refused (None if omitted or equal, bit for bit, to the bound
        one): the compiled code has the bound value built in and would silently ignore another."""
        name = spec["name"]
        if name not in arrays:
            return None
        a, want = np.asarray(arrays[name]), self.bound_values[name]
        shown = f" {spec['value']}" if "value" in spec else f" (sha256 {spec['sha256'][:12]}...)"
        head = f"input '{name}' was bound at compile time (--bind-input) to {spec['dtype']}{spec['shape']}{shown}"
        if a.dtype != want.dtype or a.shape != want.shape:
            return f"{head}, but a {a.dtype.name}{list(a.shape)} value was given: omit it or recompile"
        flat, bound = np.ascontiguousarray(a).reshape(-1), want.reshape(-1)
        differs = np.flatnonzero((flat.view(np.uint8).reshape(a.size, -1) != bound.view(np.uint8).reshape(a.size, -1)).any(1))
        if differs.size:
            k = int(differs[0])
            at = [int(i) for i in np.unravel_index(k, a.shape)]
            return (f"{head}, but the value given differs (at {at}: {flat[k].item()!r}, bound {bound[k].item()!r}): omit it or "
                    f"recompile with --bind-input {name}=FILE.npy")
        return None

    def _collect(self, result) -> dict[str, np.ndarray]:
        items = list(result) if len(self.outputs) > 1 else [result]
        return {spec["name"]: _as_spec(item.numpy(), spec) for spec, item in zip(self.outputs, items)}

    def __call__(self, **arrays: np.ndarray) -> dict[str, np.ndarray]:
        return self._collect(self._vm["main"](*self._arguments(arrays)))

    def bound(self, arrays: dict[str, np.ndarray]) -> Callable[[], object]:
        """``main`` on ``arrays``, copied to the device once: each call launches the model's kernels and nothing
        else (its outputs stay on the device), for an outside profiler to watch."""
        args = self._arguments(arrays)
        return lambda: self._vm["main"](*args)

    def capture(self, arrays: dict[str, np.ndarray]) -> CudaGraph:
        """``main`` on ``arrays`` recorded into a CUDA graph, replayed by each call of it (GPU packages built without
        ``--cuda-graph``: the driver refuses to record TVM's own graph capture inside this one, H100 2026-12-06,
        cudaErrorStreamCaptureUnsupported)."""
        if self.manifest.get("options", {}).get("cuda_graph"):
            raise TvmpipeError(f"{self.path} was built with --cuda-graph, whose own CUDA graph cannot be recorded "
                               "inside another: rebuild it without --cuda-graph to record the whole call")
        if self.manifest["target"]["kind"] != "cuda":
            raise TvmpipeError(f"{self.path} is built for {self.manifest['target']['name']}: a CUDA graph needs a "
                               "package built for a GPU target")
        return CudaGraph(self, arrays)

    def time(self, arrays: dict[str, np.ndarray], repeat: int = 50, warmup: int = 5, number: int = 1) -> Timing:
        """Latency of one call with inputs already on the device (outputs stay there too); ``number`` > 1: each
        figure is the mean of that many calls issued back to back (the host's launches then overlap the device's
        work, as a model's chain of kernels does: the device's time per call where the host keeps ahead)."""
        args = self._arguments(arrays)
        self._vm.set_input("main", *args)
        evaluator = self._vm.time_evaluator
        evaluator("invoke_stateful", self.device, number=1, repeat=max(warmup, 1))("main")  # first-touch costs
        timer = evaluator("invoke_stateful", self.device, number=number, repeat=repeat)
        return Timing([t * 1e3 for t in timer("main").results])

    def profile(self, arrays: dict[str, np.ndarray], repeat: int = 10) -> list[KernelTime]:
        """Time every kernel launch of ``main`` (sorted by total time), through the VM's call instrument.

        TVM 0.27's VM lost its profiler; its instrument hook is called before and after each call, so each
        call is timed between two device syncs. A GPU kernel's time thus includes its launch and a sync
        (~10 us): the ranking of the big kernels is what this is for, the sum exceeds ``time()``. A package
        built with ``--cuda-graph`` shows its replayed graph as one call after the first run.
        """
        import time

        args = self._arguments(arrays)
        kernels = self.manifest.get("kernels", {})
        totals: dict[str, list[float]] = {}
        start = [0.0]

        def instrument(func, symbol: str, before: bool, ret, *call_args) -> int:
            self.device.sync()
            if before:
                start[0] = time.perf_counter()
            elif symbol in kernels or not symbol.startswith("vm.builtin."):
                totals.setdefault(symbol, []).append((time.perf_counter() - start[0]) * 1e3)
            return 0  # VMInstrumentReturnKind.NO_OP: run the call as usual

        self._vm["main"](*args)  # first-touch costs (allocation, CUDA graph capture) stay out of the numbers
        self._vm.set_instrument(instrument)
        try:
            for _ in range(repeat):
                self._vm["main"](*args)
        finally:
            self._vm.set_instrument(None)
        rows = [KernelTime(name, kernels.get(name, "-"), len(ms) // repeat, sum(ms) / repeat)
                for name, ms in totals.items()]
        return sorted(rows, key=lambda r: -r.ms)

    def random_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Random arrays matching the manifest (integers in [0, 10) for index-like inputs)."""
        rng = np.random.default_rng(seed)
        out = {}
        for spec in self.inputs:
            dt = numpy_dtype(spec["dtype"])
            if dt.kind == "f":
                out[spec["name"]] = rng.standard_normal(spec["shape"]).astype(dt)
            elif dt.kind == "b":
                out[spec["name"]] = rng.integers(0, 2, spec["shape"]).astype(dt)
            else:
                out[spec["name"]] = rng.integers(0, 10, spec["shape"]).astype(dt)
        return out


def _cuda_driver():
    """NVIDIA's Python bindings of the CUDA driver (stream capture, graphs, events: TVM's runtime exposes none)."""
    try:
        from cuda.bindings import driver
    except ImportError:
        raise TvmpipeError("a CUDA graph needs NVIDIA's CUDA bindings: pip install 'cuda-bindings>=13'") from None
    return driver


def _cu(result: tuple):
    """A cuda-bindings call's values, or a TvmpipeError naming the CUDA error."""
    err, *values = result
    if int(err):
        name = _cuda_driver().cuGetErrorName(err)[1]
        raise TvmpipeError(f"CUDA error {name.decode() if isinstance(name, bytes) else err}")
    return values[0] if len(values) == 1 else values


class CudaGraph:
    """A GPU package's ``main`` recorded once into a CUDA graph and replayed: one launch a call, on the device
    buffers it was recorded with, as a torch CUDA graph. ``compile --cuda-graph`` records only the kernels that
    neither read the model's inputs nor write its outputs (TVM's RewriteCUDAGraph), so a model of a few kernels,
    such as a decoding step, keeps every launch and the VM's work around them; this records them all.

    ``graph(**arrays)`` copies the arrays given into the recorded inputs (the others keep their last values),
    replays and returns the outputs; ``replay()`` launches only (for timing). It replays on the stream that was
    current when recording: memory that the recorded call freed went back to TVM's pool, and later calls may be
    given it, which is safe while they are ordered with the replays on that stream.
    """

    def __init__(self, runner: Runner, arrays: dict[str, np.ndarray]):
        import tvm_ffi

        cu = self._cu = _cuda_driver()
        self._runner = runner
        self._inputs = runner._arguments(arrays)
        main = runner._vm["main"]
        main(*self._inputs)  # loads the kernels and fills the memory pools: neither may happen while recording
        runner.device.sync()
        self._stream = cu.CUstream(tvm_ffi.get_raw_stream(runner.device) or 0)
        record = _cu(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING.value))
        _cu(cu.cuStreamBeginCapture(record, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
        try:
            with tvm_ffi.use_raw_stream(runner.device, int(record)):
                self._outputs = main(*self._inputs)  # the graph writes these buffers
        except Exception as err:
            cu.cuStreamEndCapture(record)
            cu.cuStreamDestroy(record)
            raise TvmpipeError(f"{runner.path}: its main cannot be recorded into a CUDA graph "
                               f"({str(err).strip().splitlines()[-1]})") from None
        graph = _cu(cu.cuStreamEndCapture(record))
        cu.cuStreamDestroy(record)
        self._exec = _cu(cu.cuGraphInstantiate(graph, 0))
        cu.cuGraphDestroy(graph)
        weakref.finalize(self, cu.cuGraphExecDestroy, self._exec)

    def replay(self) -> None:
        _cu(self._cu.cuGraphLaunch(self._exec, self._stream))

    def __call__(self, **arrays: np.ndarray) -> dict[str, np.ndarray]:
        host = self._runner._host_arrays(arrays, partial=True)
        _cu(self._cu.cuStreamSynchronize(self._stream))  # the last replay has read the inputs
        for spec, tensor in zip(self._runner.inputs, self._inputs):
            if spec["name"] in host:
                tensor.copyfrom(host[spec["name"]])
        self.replay()
        _cu(self._cu.cuStreamSynchronize(self._stream))
        return self._runner._collect(self._outputs)

    def time(self, repeat: int = 50, warmup: int = 5, number: int = 1) -> Timing:
        """As ``Runner.time``: each figure the mean over ``number`` replays between two CUDA events, in ms."""
        cu = self._cu
        start, end = _cu(cu.cuEventCreate(0)), _cu(cu.cuEventCreate(0))
        for _ in range(max(warmup, 1)):
            self.replay()
        ms = []
        for _ in range(repeat):
            _cu(cu.cuEventRecord(start, self._stream))
            for _ in range(number):
                self.replay()
            _cu(cu.cuEventRecord(end, self._stream))
            _cu(cu.cuEventSynchronize(end))
            ms.append(_cu(cu.cuEventElapsedTime(start, end)) / number)
        cu.cuEventDestroy(start)
        cu.cuEventDestroy(end)
        return Timing(ms)


def profile_table(kernels: list[KernelTime], top: int = 15) -> list[str]:
    """Lines of a table of the ``top`` kernels by time (``Runner.profile``), then one line for the rest."""
    total = sum(k.ms for k in kernels) or 1.0
    lines = [f"{'kernel':<60} {'schedule':<24} {'calls':>5} {'ms':>9} {'share':>6}"]
    for k in kernels[:top]:
        name = k.name if len(k.name) <= 60 else k.name[:57] + "..."
        lines.append(f"{name:<60} {k.schedule:<24} {k.calls:>5} {k.ms:>9.4f} {k.ms / total:>6.1%}")
    if rest := kernels[top:]:
        ms = sum(k.ms for k in rest)
        more = f"({len(rest)} more kernels)"
        lines.append(f"{more:<60} {'':<24} {sum(k.calls for k in rest):>5} {ms:>9.4f} {ms / total:>6.1%}")
    return lines


def load(path: str) -> Runner:
    """Load a package and check it against this machine."""
    return Runner(str(path))
