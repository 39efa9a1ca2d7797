"""What the benchmark scripts share."""

from __future__ import annotations

import argparse
import csv
import io
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

# CPU: thread pools spin after a call, holding a core: TVM's worker for ~120 ms after the last kernel, onnxruntime's
# for ~40 ms (each thread's CPU ticks in /proc, 2026-12-04). What is timed within that window shares the 2 cores with
# the spinning thread: a 128 x 16384 softmax ran 0.17 ms alone and 0.33 ms (best of 30) right after onnxruntime, a
# 20 ms pause between them was not enough.
POOL_SPIN_S = 0.25


def settle() -> None:
    """Before timing one CPU implementation after another in the same process: wait out the other's spinning pool."""
    time.sleep(POOL_SPIN_S)


def interleaved(turns: dict[str, Callable[[], list[float]]], rounds: int,
                order: Callable[[int], list[str]] | None = None,
                pause: Callable[[], None] = settle) -> dict[str, list[float]]:
    """Each implementation's ``turn`` (its timed runs, ms) once a round, in ``order(round)`` (default: as given), each
    after ``pause``: spread over the rounds, load from elsewhere on a shared machine hits every implementation alike.
    The ms of every turn, per implementation."""
    times: dict[str, list[float]] = {name: [] for name in turns}
    for round_ in range(rounds):
        for name in order(round_) if order else turns:
            pause()
            times[name] += turns[name]()
    return times


def rotation(names: list[str]) -> Callable[[int], list[str]]:
    """An ``interleaved`` order in which each round starts one later than the last."""
    return lambda i: names[i % len(names):] + names[:i % len(names)]


def build_or_run(doc: str, built: str, run_does: str = "check and time them on the GPU machine"
                 ) -> argparse.ArgumentParser:
    """The parser of a GPU script that ``--build``s ``built`` here and ``--run``s them there (one of the two, required),
    writing under ``--out``; the caller adds its own flags."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--build", action="store_true", help=f"compile the {built} here")
    mode.add_argument("--run", action="store_true", help=run_does)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    return ap


def cuda_ms(fn, repeat: int, warmup: int) -> list[float]:
    """Per-call latency of ``fn`` with CUDA events, one call between each pair (launch overhead included)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return out


def cuda_kernel_us(fn, calls: int, width: int = 80) -> dict[str, dict]:
    """Per kernel ``fn`` launches (by the first ``width`` characters of its name): GPU microseconds and launches per
    call, over ``calls`` calls back to back (CUPTI through torch's profiler, which records the TVM runtime's launches
    too); the most time first."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out: dict[str, dict] = {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            k = out.setdefault(e.name[:width], {"us": 0.0, "launches": 0.0})
            k["us"] += e.time_range.elapsed_us() / calls
            k["launches"] += 1 / calls
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["us"]))


def compile_with(root: Path, model: Path, package: Path, target: str = "cpu", **options) -> None:
    """Compile ``model`` for ``target`` with the checkout at ``root`` (its own ``compiler`` package, in a fresh
    interpreter); ``options``: fields of its ``pipeline.Options``. For A/Bs against an older commit."""
    code = (f"import sys; sys.path.insert(0, {str(root)!r}); from compiler import pipeline; "
            f"pipeline.compile_model({str(model)!r}, {target!r}, {str(package)!r}, options=pipeline.Options(**{options!r}))")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


# Nsight Compute: the sections profiled, and (record key, ncu metric name) of the figures kept from them
NCU_SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats",
                "SchedulerStats", "WarpStateStats")
NCU_METRICS = (("duration_ns", "Duration"), ("elapsed_cycles", "Elapsed Cycles"), ("grid", "Grid Size"),
               ("block", "Block Size"), ("registers", "Registers Per Thread"),
               ("shared_bytes", "Dynamic Shared Memory Per Block"), ("sm_throughput_pct", "Compute (SM) Throughput"),
               ("l2_throughput_pct", "L2 Cache Throughput"), ("dram_throughput_pct", "DRAM Throughput"),
               ("issued_ipc", "Issued Ipc Active"), ("active_warps_per_scheduler", "Active Warps Per Scheduler"),
               ("warp_cycles_per_issue", "Warp Cycles Per Issued Instruction"),
               ("l2_bytes", "lts__t_bytes.sum"), ("dram_read_bytes", "dram__bytes_read.sum"),
               ("dram_write_bytes", "dram__bytes_write.sum"))
_STALLS = "smsp__average_warps_issue_stalled_"  # + reason + "_per_issue_active.ratio"
# each pipe's utilisation (% of its peak over the SMs' active cycles): instructions issued to it, and (tensor cores,
# shared memory) its busy cycles; the pipes a GPU has differ, so they are asked for by pattern
_PIPE = r"\.avg\.pct_of_peak_sustained_active"
_PIPE_METRIC = re.compile(rf"^sm__(inst_executed_pipe|pipe_[a-z0-9_]+_cycles_active).*{_PIPE}$")
_PIPES = f"regex:{_PIPE_METRIC.pattern}"  # (the same pattern, as ncu's --metrics takes it)


def torchvision_onnx(name: str, path: Path, side: int = 224) -> Path:
    """torchvision's ``name`` with seeded random weights, exported (dynamo) for a batch of one ``side`` x ``side``
    image (input "x", output "y"), for A/Bs on models beyond the zoo (``models.py`` caches the zoo's own)."""
    import torch
    import torchvision

    if not path.is_file():
        torch.manual_seed(0)
        net = getattr(torchvision.models, name)(weights=None).eval()
        torch.onnx.export(net, (torch.randn(1, 3, side, side),), path, input_names=["x"], output_names=["y"], dynamo=True)
    return path


def gpu_slug() -> str:
    """The current CUDA device's name as a results-file slug ("NVIDIA H200" -> "h200")."""
    import torch

    return torch.cuda.get_device_name().lower().replace("nvidia", "").strip().replace(" ", "-")


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def ncu_profile(kernels: str, argv: list[str]) -> list[dict]:
    """Nsight Compute over ``python argv`` (GPU machine): per launch of a kernel matching ``kernels`` (ncu's ``-k``,
    e.g. "regex:cudnn"), in launch order, its name, ``NCU_METRICS``, its warp stall reasons (cycles per issued
    instruction, those over 0.05) and its pipes' utilisation (% of peak, those over 0.5). ncu locks the clocks, so
    durations differ from a benchmark's; ratios do not much."""
    raw = [name for _, name in NCU_METRICS if "__" in name]
    sections = [a for s in NCU_SECTIONS for a in ("--section", s)]

    def ncu(metrics: list[str]) -> subprocess.CompletedProcess:
        cmd = ["ncu", "--csv", "--page", "details", "--print-units", "base", "-k", kernels, *sections,
               "--metrics", ",".join(metrics), sys.executable, *argv]
        return subprocess.run(cmd, capture_output=True, text=True)

    done = ncu(raw + [f"regex:^{_STALLS}.*_per_issue_active.ratio$", _PIPES])
    if done.returncode:  # (an ncu that does not take the stall or pipe metrics: without them)
        print(f"ncu with stall reasons and pipes failed ({done.stderr.strip()[-300:]}); without them", flush=True)
        done = ncu(raw)
        done.check_returncode()
    launches: dict[str, dict] = {}
    text = "".join(line + "\n" for line in done.stdout.splitlines() if not line.startswith("=="))
    for row in csv.DictReader(io.StringIO(text)):
        launches.setdefault(row["ID"], {"kernel": row["Kernel Name"][:120]})[row["Metric Name"]] = row["Metric Value"]
    return [{"kernel": got["kernel"], **{key: _number(got[name]) for key, name in NCU_METRICS if name in got},
             "stalls": _stalls(got), "pipes": _pipes(got)} for got in launches.values()]


def _stalls(metrics: dict[str, str]) -> dict[str, float]:
    """Warp stall reason -> cycles per issued instruction, those over 0.05, largest first."""
    stalls = {name[len(_STALLS):].split("_per_issue")[0]: _number(value)
              for name, value in metrics.items() if name.startswith(_STALLS)}
    return dict(sorted(((k, v) for k, v in stalls.items() if v > 0.05), key=lambda kv: -kv[1]))


def _pipes(metrics: dict[str, str]) -> dict[str, float]:
    """Pipe -> % of its peak, those over 0.5, busiest first ("xu": transcendentals and conversions, "fma", "alu",
    "tensor_op_gmma_cycles_active": the tensor cores under wgmma, ...)."""
    pipes = {re.sub(rf"^sm__(inst_executed_pipe_|pipe_)|{_PIPE}$", "", name): _number(value)
             for name, value in metrics.items() if _PIPE_METRIC.fullmatch(name)}
    # ncu reports some pipes twice, also in its "realtime" clock domain: the same figure (all 42 such pairs in the
    # committed H200 profiles), so the twin is dropped
    pipes = {k: v for k, v in pipes.items() if not (k.endswith("_realtime") and k.removesuffix("_realtime") in pipes)}
    return dict(sorted(((k, v) for k, v in pipes.items() if v > 0.5), key=lambda kv: -kv[1]))


def ncu_line(r: dict) -> str:
    """One profiled launch (``ncu_profile``'s record) in a line."""
    return (f"{r['duration_ns'] / 1e3:8.1f} us, SM {r['sm_throughput_pct']:5.1f} %, L2 {r['l2_throughput_pct']:5.1f} %, "
            f"DRAM {r['dram_throughput_pct']:5.1f} %, IPC {r['issued_ipc']:.2f}, {r['registers']:.0f} regs x "
            f"{r['block']:.0f} threads, grid {r['grid']:.0f}; L2 {r['l2_bytes'] / 1e9:.3f} GB, DRAM read "
            f"{r['dram_read_bytes'] / 1e9:.3f} / write {r.get('dram_write_bytes', 0) / 1e9:.3f} GB; stalls {r['stalls']}"
            + (f"; pipes {r['pipes']}" if r.get("pipes") else ""))
