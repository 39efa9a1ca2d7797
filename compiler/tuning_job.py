"""``tvmpipe tune``: MetaSchedule over the kernels no hand-written schedule covers, into a log that compile applies.

MetaSchedule is TVM's auto-scheduler (Ansor's search space, evolutionary search guided by an XGBoost cost
model); its gradient task scheduler splits the trial budget over the kernels by expected gain. Around it this
module adds what a long job needs:

- Resume. The log (``tuning_log``) commits one record per measured candidate, so a job killed at any point loses
  at most the batches in flight; ``--resume`` continues to the same total budget. MetaSchedule's evolutionary
  search only remembers what it measured in its own process (a TODO in evolutionary_search.cc), so
  ``_SkipMeasured`` drops candidates whose scheduled IRModule is already in the log, and the cost model is
  retrained on the log before the first batch.
- Cost model. ``XGBModel`` answers with random scores until it holds ``num_warmup_samples`` (default 100)
  measurements. The first batch of every kernel is drawn before any measurement returns anyway (the scheduler's
  round-robin round), so the warm-up only delays the model past that round when the round is smaller than 100
  samples: a one-kernel job of 96 trials would never use it, and any 64-trial job is a random search under
  another name. We use 0: the model ranks candidates as soon as measurements exist, retrained whenever its data
  grows by 20 %. Batches hold budget / (4 x kernels) trials, so that the model is consulted about four times per
  kernel, but at least 8 (each batch costs a search and a builder pool on top of its trials) and at most 64.
  Measured (benchmarks/tune_xgb_vs_random.py, 96 trials, two kernels x two seeds, a shared 2-core machine): the
  best latencies of the two models differ by less than the run-to-run spread, so the model's effect at this
  budget is not shown there.
- Search cost. The evolutionary search scores its population (512 by default) with the cost model four times per
  batch, which dominates the wall time on few cores: we use 64 per host core, 128..512.
- Builder. ``LocalBuilder``'s default build function imports ``tvm.s_tir.tensor_intrin`` (~18 s) in every worker
  process, and the pool is new for each batch; that is only needed where a schedule may tensorize. Its export
  leaves CUDA as source, which TVM compiles at load with ``--use_fast_math``; ours compiles it as a package's is
  (exact math), so that the measured candidates are the code that ships.
- Visible. A tqdm bar driven by a measure callback; a MetaSchedule-style table at the end; ``tuning_report.json``
  (rewritten after every batch) and ``tuning_curve.png`` in the log directory; MetaSchedule's own log in
  ``logs/`` there.
- Baseline. MetaSchedule only compares its own candidates, never the schedule a kernel gets without a log (the
  default lowering on CPU, DLight on GPU), and a tuned schedule can lose to it. So each task's default schedule
  is measured once (``_measure_defaults``, same builder and runner as the trials; a resumed job reuses the
  report's value) into the report's ``default_us``, and compile keeps the default where no record beats it.
- Distributed measurement. ``rpc="HOST:PORT"`` measures on every RPC server registered under ``rpc_key`` with
  TVM's tracker (MetaSchedule's RPCRunner, one connection per free server).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import tvm
import tvm_ffi
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback
from tvm.s_tir.analysis import estimate_tir_flops
from tvm.s_tir.meta_schedule.search_strategy import PySearchStrategy

from . import tuning, tuning_log
from .errors import TvmpipeError
from .schedules import is_scheduled
from .targets import TargetInfo

COST_MODELS = ("xgb", "random")


@dataclass
class Task:
    """One kernel being tuned (a MetaSchedule workload) and the best of its measurements so far."""

    name: str
    mod: tvm.IRModule
    weight: int  # call sites in the model
    flop: float
    trials: int = 0
    errors: int = 0
    best: float | None = None  # seconds
    default: float | None = None  # seconds, the untuned schedule (``tuning.default_schedule``); None: not measured

    def add(self, secs: float | None) -> None:
        self.trials += 1
        if secs is None:
            self.errors += 1
        elif self.best is None or secs < self.best:
            self.best = secs

    def row(self) -> dict:
        us = self.best * 1e6 if self.best is not None else None
        gflops = self.flop / self.best / 1e9 if self.best else None
        default = self.default * 1e6 if self.default is not None else None
        return {"name": self.name, "flop": self.flop, "weight": self.weight, "trials": self.trials,
                "errors": self.errors, "best_us": us, "gflops": gflops, "default_us": default}


@dataclass
class Job:
    """A tuning job's state: what the report, the bar and the summary show."""

    meta: dict
    tasks: list[Task]
    log_dir: Path
    history: list[tuple[int, float | None]] = field(default_factory=list)  # (task, seconds or None), in order
    started: float = field(default_factory=time.time)
    elapsed_before: float = 0.0  # seconds spent by earlier runs of this job (resume)
    compacted_away: int = 0  # measurements that --compact removed from the log (they count, but are not in history)
    stopping: bool = False  # Ctrl-C / SIGINT: stop after the batch in flight

    def trials(self) -> int:
        return self.compacted_away + len(self.history)

    def add(self, task: int, secs: float | None) -> None:
        self.tasks[task].add(secs)
        self.history.append((task, secs))

    def estimate_us(self) -> float | None:
        """Sum over kernels of weight x best latency: the tuned kernels' share of one inference."""
        if any(t.best is None for t in self.tasks):
            return None
        return sum(t.weight * t.best for t in self.tasks) * 1e6

    def estimate_default_us(self) -> float | None:
        """The same sum over the untuned schedules."""
        if any(t.default is None for t in self.tasks):
            return None
        return sum(t.weight * t.default for t in self.tasks) * 1e6

    def report(self, status: str) -> dict:
        best: list[float | None] = [None] * len(self.tasks)
        per_task: list[list] = [[] for _ in self.tasks]
        total: list[list] = []
        for n, (i, secs) in enumerate(self.history, 1 + self.compacted_away):
            if secs is not None and (best[i] is None or secs < best[i]):
                best[i] = secs
                per_task[i].append([n, secs * 1e6])
                if all(b is not None for b in best):
                    total.append([n, sum(t.weight * b for t, b in zip(self.tasks, best)) * 1e6])
        return {**self.meta, "status": status, "trials": self.trials(), "compacted_away": self.compacted_away,
                "elapsed_s": round(self.elapsed_before + time.time() - self.started, 1),
                "estimated_total_us": self.estimate_us(), "estimated_default_us": self.estimate_default_us(),
                "tasks": [{**t.row(), "curve_us": c} for t, c in zip(self.tasks, per_task)],
                "curve_total_us": total}

    def save(self, status: str) -> dict:
        report = self.report(status)
        tuning_log.write_json(self.log_dir / tuning_log.REPORT, report)
        return report


def extract(prep) -> list:
    """MetaSchedule's tasks for the kernels left after the hand-written schedules (``pipeline.prepare``)."""
    tasks = ms.relax_integration.extract_tasks(prep.mod, prep.target.target)
    return [t for t in tasks if not is_scheduled(t.dispatched[0]["main"])]


def _build(mod: tvm.IRModule, target: tvm.target.Target, _params) -> tvm.runtime.Module:
    """MetaSchedule's default build minus its ``import tvm.s_tir.tensor_intrin`` (runs in builder workers)."""
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def _build_tensorized(mod: tvm.IRModule, target: tvm.target.Target, params) -> tvm.runtime.Module:
    """``_build`` for schedules that may tensorize: the intrinsics must be registered in the worker."""
    from tvm.s_tir import tensor_intrin  # noqa: F401

    return _build(mod, target, params)


def _export_compiled(mod: tvm.runtime.Module, spec: dict, arch: str) -> str:
    """MetaSchedule's default export (a .tar that the runner links), with the CUDA compiled here as a package's
    is (``cuda_binary.compiled_imports``, exact math): left as source, TVM compiles it at load with fast math."""
    from tvm.support.tar import tar

    from .cuda_binary import compiled_imports

    path = os.path.join(tempfile.mkdtemp(), "tvm_tmp_mod." + tar.output_format)
    mod.export_library(path, fcompile=tar, fpack_imports=compiled_imports(tvm.target.Target(spec), arch, []))
    return path


def _builder(info: TargetInfo, intrinsics: bool, cores: int) -> ms.builder.LocalBuilder:
    """The candidates' builder: ``_build`` (or ``_build_tensorized``), and on GPUs ``_export_compiled``."""
    export = partial(_export_compiled, spec=info.spec, arch=info.arch) if info.is_gpu else None
    return ms.builder.LocalBuilder(f_build=_build_tensorized if intrinsics else _build, f_export=export,
                                   max_workers=cores)


def _measure_defaults(tasks: list[Task], info: TargetInfo, builder, runner) -> None:
    """Measure the untuned schedule of every task that has none yet, as MetaSchedule measures a candidate."""
    todo = [t for t in tasks if t.default is None]
    if not todo:
        return
    print(f"measuring the untuned schedule of {len(todo)} kernels", file=sys.stderr)
    target = info.target
    mods = []
    with target:
        for t in todo:
            func, _ = tuning.default_schedule(t.mod["main"], info)
            mods.append(t.mod if func is None else tvm.IRModule({"main": func}))
    built = builder.build([ms.builder.BuilderInput(mod, target) for mod in mods])
    device = tvm.runtime.device(target.get_target_device_type()).__device_type_name__()  # "cpu", "cuda"
    inputs = [ms.runner.RunnerInput(b.artifact_path, device, ms.arg_info.ArgInfo.from_prim_func(m["main"]))
              for b, m in zip(built, mods) if b.error_msg is None]
    results = iter(f.result() for f in runner.run(inputs))
    for t, b in zip(todo, built):
        if b.error_msg is not None:
            warnings.warn(f"could not build the default schedule of {t.name}: {b.error_msg}")
            continue
        ran = next(results)
        ms.utils.remove_build_dir(b.artifact_path)
        if ran.error_msg is None and ran.run_secs:
            t.default = tuning.mean_secs(ran.run_secs)
        else:
            warnings.warn(f"could not run the default schedule of {t.name}: {ran.error_msg}")


def _runner(rpc: str | None, key: str | None):
    """A local runner, or MetaSchedule's RPC runner over every server the tracker has for ``key``."""
    if rpc is None:
        return ms.runner.LocalRunner()
    host, _, port = rpc.rpartition(":")
    if not host or not port.isdigit() or not key:
        raise TvmpipeError(f"--rpc takes HOST:PORT of a TVM RPC tracker and needs --rpc-key (got '{rpc}')")
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
        free = tvm.rpc.connect_tracker(host, int(port)).summary()["queue_info"].get(key, {}).get("free", 0)
    except (OSError, RuntimeError) as err:
        raise TvmpipeError(f"cannot reach the RPC tracker at {rpc} ({err}); start it with "
                           f"python -m tvm.exec.rpc_tracker --host {host} --port {port}") from None
    if not free:
        raise TvmpipeError(f"no free RPC server with key '{key}' at the tracker {rpc}; start one per device with "
                           f"python -m tvm.exec.rpc_server --tracker {rpc} --key {key}")
    config = ms.runner.RPCConfig(tracker_host=host, tracker_port=int(port), tracker_key=key, session_timeout_sec=60)
    return ms.runner.RPCRunner(rpc_config=config, max_workers=free)


@derived_object
class _SkipMeasured(PySearchStrategy):
    """MetaSchedule's evolutionary search, minus the candidates whose schedule the log already holds."""

    def __init__(self, inner, measured: set[int], job: Job):
        self.inner, self.measured, self.job = inner, measured, job

    def _initialize_with_tune_context(self, context) -> None:
        self.inner._initialize_with_tune_context(context)

    def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None, cost_model=None) -> None:
        self.inner.pre_tuning(max_trials, num_trials_per_iter, design_spaces, database, cost_model)

    def post_tuning(self) -> None:
        self.inner.post_tuning()

    def generate_measure_candidates(self):
        for _ in range(8):  # a batch made only of known schedules: ask again (the search moves on), a few times
            batch = None if self.job.stopping else self.inner.generate_measure_candidates()
            if batch is None or self.job.stopping:  # stopping: the scheduler still commits the batches in flight
                return None
            fresh = [c for c in batch if tvm_ffi.structural_hash(c.sch.mod) not in self.measured]
            if fresh:
                return fresh
        return None

    def notify_runner_results(self, measure_candidates, results) -> None:
        self.inner.notify_runner_results(measure_candidates, results)

    def clone(self):
        return _SkipMeasured(self.inner.clone(), self.measured, self.job)


@derived_object
class _Progress(PyMeasureCallback):
    """Counts every measured candidate into the job, moves the bar, rewrites the report."""

    def __init__(self, job: Job, bar):
        self.job, self.bar = job, bar

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        for built, ran in zip(builder_results, runner_results):
            ok = built.error_msg is None and ran.error_msg is None and ran.run_secs
            self.job.add(task_id, tuning.mean_secs(ran.run_secs) if ok else None)
        task = self.job.tasks[task_id]
        self.bar.update(len(measure_candidates))
        best = f"best {task.best * 1e6:.1f} us, {task.flop / task.best / 1e9:.2f} GFLOPS" if task.best else "no valid run yet"
        self.bar.set_postfix_str(f"task {task_id + 1}/{len(self.job.tasks)} {task.name}: {best}")
        self.job.save("running")


class _Lines:
    """Where tqdm is not installed (a bare device machine): one progress line per batch."""

    def __init__(self, total: int, initial: int):
        self.n, self.total, self.t0 = initial, total, time.time()

    def update(self, n: int) -> None:
        self.n += n

    def set_postfix_str(self, text: str) -> None:
        secs = time.time() - self.t0
        print(f"tuning {self.n}/{self.total} trials, {secs:.0f} s: {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def _bar(total: int, initial: int):
    try:
        from tqdm import tqdm
    except ImportError:
        return _Lines(total, initial)
    return tqdm(total=total, initial=initial, unit="trial", desc="tuning", dynamic_ncols=True, file=sys.stderr)


def summary(report: dict) -> str:
    """A table like MetaSchedule's tuning statistics, for the whole log (earlier runs included)."""
    head = (f"{'ID':>3}  {'Task':<44} {'FLOP':>10} {'Weight':>6} {'GFLOPS':>8} {'Latency (us)':>12} "
            f"{'Default (us)':>12} {'Trials':>6} {'Errors':>6}")
    rows = [head, "-" * len(head)]
    slower = 0
    for i, t in enumerate(report["tasks"]):
        best, default = t["best_us"], t.get("default_us")
        lat = f"{best:12.2f}" if best is not None else f"{'N/A':>12}"
        gfl = f"{t['gflops']:8.2f}" if t["gflops"] is not None else f"{'N/A':>8}"
        mark = "*" if default is not None and (best is None or best >= default) else " "
        slower += mark == "*"
        dft = f"{default:11.2f}{mark}" if default is not None else f"{'N/A':>12}"
        rows.append(f"{i:>3}  {t['name'][:44]:<44} {int(t['flop']):>10} {t['weight']:>6} {gfl} {lat} {dft} "
                    f"{t['trials']:>6} {t['errors']:>6}")
    total, default = report["estimated_total_us"], report.get("estimated_default_us")
    rows.append("-" * len(head))
    rows.append(f"{report['trials']} trials in {report['elapsed_s']:.0f} s ({report['status']}); estimated total "
                f"(sum of weight x latency): {f'{total:.2f} us' if total is not None else 'N/A'}, untuned "
                f"{f'{default:.2f} us' if default is not None else 'N/A'}")
    if slower:
        rows.append(f"* {slower} kernels: no tuned schedule beats the default yet, compile keeps the default")
    return "\n".join(rows)


def plot(report: dict, path: Path) -> None:
    """The tuning curve: estimated total and each kernel's best latency against trials."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warnings.warn(f"matplotlib is not installed: {path.name} not written")
        return
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 10), sharex=True, height_ratios=(2, 3))
    last = max(report["trials"], 1)
    for ax, curves in ((top, [("total", report["curve_total_us"])]),
                       (bottom, [(t["name"], t["curve_us"]) for t in report["tasks"]])):
        for name, points in curves:
            if points:
                xs, ys = zip(*points, (last, points[-1][1]))
                ax.step(xs, ys, where="post", label=name)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    top.set_ylabel("estimated total (us)\nsum of weight x best latency")
    top.set_title(f"{Path(report['model']).name} on {report['target']['name']}: {report['cost_model']} cost model")
    bottom.set_ylabel("best latency per kernel (us)")
    bottom.set_xlabel("trials")
    if bottom.lines:
        bottom.legend(fontsize=6, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _open(prep, log_dir: Path, tasks: list[Task], resume: bool) -> tuple:
    """The log under the caller's lock, repaired and checked: (database, its measurements of these tasks in
    order, its records grouped by task, the report of earlier runs or {})."""
    from tvm.s_tir.meta_schedule.database import Workload

    lines = tuning_log.repaired(log_dir)
    report = log_dir / tuning_log.REPORT
    previous = json.loads(report.read_text()) if report.is_file() else {}
    if lines.records and not resume:
        raise TvmpipeError(f"{log_dir} already holds {len(lines.records)} tuning records: pass --resume to "
                           "continue that job, or --log-dir for a new one")
    if previous.get("model_key", prep.key) != prep.key:
        raise TvmpipeError(f"{log_dir} is the log of another model (key {previous['model_key']}, this one is "
                           f"{prep.key}): use another --log-dir")
    database = tuning_log.database(log_dir)
    by_hash = {tvm_ffi.structural_hash(t.mod): i for i, t in enumerate(tasks)}
    task_of_line = [by_hash.get(tvm_ffi.structural_hash(Workload.from_json(json.loads(w)).mod)) for w in lines.workloads]
    history = [(task_of_line[w], secs) for w, secs in lines.measurements() if task_of_line[w] is not None]
    records: list[list] = [[] for _ in tasks]
    for record in database.get_all_tuning_records():
        task = by_hash.get(tvm_ffi.structural_hash(record.workload.mod))
        if task is not None:
            records[task].append(record)
    return database, history, records, previous if resume else {}


def _contexts(job: Job, records: list[list], target, population: int, cores: int, seed: int | None) -> list:
    """One TuneContext per task: the evolutionary search, minus what the log already measured."""
    contexts = []
    for task, recs, rand in zip(job.tasks, records, ms.utils.fork_seed(seed, len(job.tasks))):
        measured = {tvm_ffi.structural_hash(r.as_measure_candidate().sch.mod) for r in recs}
        search = _SkipMeasured(ms.search_strategy.EvolutionarySearch(population_size=population), measured, job)
        contexts.append(ms.TuneContext(mod=task.mod, target=target, space_generator="post-order-apply",
                                       search_strategy=search, task_name=task.name, rand_state=rand, num_threads=cores,
                                       logger=logging.getLogger(f"tvm.s_tir.meta_schedule.task.{task.name}")))
    return contexts


def _cost_model(kind: str, contexts: list, records: list[list], cores: int, seed: int | None):
    """XGBoost without warm-up (module docstring), trained on the log; or random scores."""
    if kind == "random":
        return ms.cost_model.RandomModel(seed=seed)
    model = ms.cost_model.XGBModel(num_warmup_samples=0, num_tuning_cores=cores)
    for ctx, recs in zip(contexts, records):
        model.update(ctx, [r.as_measure_candidate() for r in recs],
                     [ms.runner.RunnerResult([float(s) for s in r.run_secs], None) for r in recs])
    return model


def tune(prep, *, trials: int, log_dir: Path | None = None, resume: bool = False, cost_model: str = "xgb",
         rpc: str | None = None, rpc_key: str | None = None, seed: int | None = None) -> dict:
    """Tune ``prep`` (``pipeline.prepare``) until the log holds ``trials`` measurements; return the report.
    Ctrl-C / SIGINT stops it cleanly (report written), then raises KeyboardInterrupt."""
    if cost_model not in COST_MODELS:
        raise TvmpipeError(f"unknown cost model '{cost_model}' (choose from {', '.join(COST_MODELS)})")
    if trials < 1:
        raise TvmpipeError(f"--trials must be at least 1 (got {trials})")
    log_dir = Path(log_dir) if log_dir is not None else tuning.log_dir(prep.target, prep.key)
    tasks = [Task(t.task_name, t.dispatched[0], int(t.weight), max(1.0, estimate_tir_flops(t.dispatched[0])))
             for t in extract(prep)]
    if not tasks:
        raise TvmpipeError(f"{prep.imported.source}: nothing to tune, every kernel is hand-scheduled "
                           f"({', '.join(prep.hand)})")
    runner = _runner(rpc, rpc_key)
    cores = len(os.sched_getaffinity(0))
    with tuning_log.locked(log_dir):
        database, history, records, previous = _open(prep, log_dir, tasks, resume)
        done = previous.get("compacted_away", 0) + len(history)
        if done >= trials:
            print(f"{log_dir} already holds {done} trials of this model (budget {trials}): nothing to do")
            if previous:
                print(summary(previous))
            return previous
        remaining = trials - done
        per_batch = max(8, min(64, remaining // (4 * len(tasks))))
        population = min(512, max(128, 64 * cores))
        meta = {"model": str(prep.imported.source), "model_key": prep.key,
                "target": {"name": prep.target.name, "spec": prep.target.spec}, "cost_model": cost_model,
                "runner": f"rpc {rpc} key {rpc_key}" if rpc else "local", "trials_budget": trials,
                "search": {"population_size": population, "trials_per_batch": per_batch, "num_warmup_samples": 0},
                "hand_scheduled": sorted(prep.hand)}
        job = Job(meta, tasks, log_dir, elapsed_before=previous.get("elapsed_s", 0.0),
                  compacted_away=previous.get("compacted_away", 0))
        for task, secs in history:
            job.add(task, secs)
        stored = {t["name"]: t.get("default_us") for t in previous.get("tasks", [])}
        for task in tasks:
            task.default = stored[task.name] / 1e6 if stored.get(task.name) else None
        if done:
            print(f"resuming {log_dir}: {done} of {trials} trials measured, {remaining} to go", file=sys.stderr)
        contexts = _contexts(job, records, prep.target.target, population, cores, seed)
        model = _cost_model(cost_model, contexts, records, cores, seed)
        intrinsics = tuning.needs_tensor_intrinsics(t.mod["main"] for t in tasks)
        builder = _builder(prep.target, intrinsics, cores)
        _measure_defaults(tasks, prep.target, builder, runner)
        job.save("running")
        bar = _bar(trials, done)
        status = "failed"
        with _meta_schedule_log(log_dir / "logs" / "meta_schedule.log"), _stop_on_sigint(job):
            try:
                ms.tune.tune_tasks(
                    tasks=contexts, task_weights=[t.weight for t in tasks], work_dir=str(log_dir),
                    max_trials_global=remaining, num_trials_per_iter=per_batch,
                    builder=builder, runner=runner, database=database, cost_model=model,
                    measure_callbacks=ms.measure_callback.MeasureCallback.create("default") + [_Progress(job, bar)],
                    task_scheduler=ms.task_scheduler.GradientBased(seed=-1 if seed is None else seed))
                status = "interrupted" if job.stopping else "complete"
            finally:
                bar.close()
                _finish(job, status)
    if job.stopping:
        raise KeyboardInterrupt  # the CLI's "tvmpipe: interrupted", exit 130
    return job.report(status)


def _finish(job: Job, status: str) -> None:
    report = job.save(status)
    plot(report, job.log_dir / tuning_log.CURVE)
    print(summary(report))


@contextmanager
def _stop_on_sigint(job: Job) -> Iterator[None]:
    """Ctrl-C stops the job once the batches in flight are measured and committed; a second one exits at once.

    A KeyboardInterrupt raised inside MetaSchedule's C++ loop can be swallowed on the way (it looks like a failed
    trace or build), so the handler only sets a flag: the search strategy then proposes nothing more. Exiting at
    once loses nothing committed: a signal handler runs between Python bytecodes, never inside the C++ write of a
    record."""

    def handler(signum, frame) -> None:
        if job.stopping:
            print("\ntvmpipe: aborted", file=sys.stderr)
            os._exit(130)
        job.stopping = True
        print("\ntvmpipe: stopping once the batches in flight are measured (Ctrl-C again to exit at once)",
              file=sys.stderr)

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def _meta_schedule_log(path: Path) -> Iterator[None]:
    """MetaSchedule logs every trial through Python's logging: into a file in the log directory, not the console."""
    path.parent.mkdir(exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(name)s %(message)s"))
    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    saved = logger.level, logger.propagate
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
