"""Auto-tuning as a user drives it: tune, compile with the log, resume after kill -9, damaged logs, locks, RPC.

Budgets are tiny (8-16 trials of one small kernel): these tests check the machinery, not the tuning quality
(benchmarks/tune_*.py measure that).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tvm_ffi
from onnx import TensorProto as TP
from onnx import helper

from helpers import make_model, ort_run, rel_err, run_cli, save

REPO = Path(__file__).resolve().parent.parent
RECORDS = "database_tuning_record.json"
slow = pytest.mark.slow  # each tuning run pays MetaSchedule's ~18 s import of TVM's tensor intrinsics, then trials


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """One MatMul+Relu kernel of odd sizes: a single tuning task.

    float64, because the hand-written CPU matmul rule takes float32/float16 kernels (and tuning skips
    hand-scheduled kernels, see test_hand_scheduled_kernels_are_not_tuned)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    m = make_model(nodes, [("x", TP.DOUBLE, [24, 40])], [("y", TP.DOUBLE, [24, 56])],
                   {"w": rng.standard_normal((40, 56))})
    return save(m, tmp_path_factory.mktemp("model") / "mm.onnx")


@pytest.fixture(scope="module")
def tuned(model, tmp_path_factory) -> Path:
    """A log of 8 trials, made through the CLI."""
    from compiler.cli import main

    log = tmp_path_factory.mktemp("tuned") / "log"
    assert main(["tune", str(model), "--target", "cpu", "--trials", "8", "--log-dir", str(log)]) == 0
    return log


def _lines(log: Path) -> list[str]:
    return (log / RECORDS).read_text().splitlines()


def _schedule_hashes(log: Path) -> list[int]:
    """The structural hash of every measured schedule in a log (replayed from the records)."""
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    db = JSONDatabase(work_dir=str(log), allow_missing=False)
    return [tvm_ffi.structural_hash(r.as_measure_candidate().sch.mod) for r in db.get_all_tuning_records()]


def _database(log: Path):
    from compiler import tuning_log

    return tuning_log.database(log, tuning_log.read(log))


def _with_default(log: Path, dest: Path, default_us: float | None) -> Path:
    """A copy of a log whose report records ``default_us`` as every kernel's untuned latency (None: none, as in
    logs written before it was measured)."""
    log = shutil.copytree(log, dest)
    report = json.loads((log / "tuning_report.json").read_text())
    for task in report["tasks"]:
        task.pop("default_us")
        if default_us is not None:
            task["default_us"] = default_us
    (log / "tuning_report.json").write_text(json.dumps(report))
    return log


def _manifest(pkg: Path) -> dict:
    import zipfile

    with zipfile.ZipFile(pkg) as zf:
        return json.loads(zf.read("manifest.json"))


@slow
def test_tune_report_and_summary(tuned):
    report = json.loads((tuned / "tuning_report.json").read_text())
    assert report["status"] == "complete" and report["trials"] == 8 == len(_lines(tuned))
    (task,) = report["tasks"]
    assert task["name"] == "fused_matmul_relu" and task["trials"] == 8 and task["flop"] == 2 * 24 * 40 * 56 + 24 * 56  # matmul + relu
    assert task["best_us"] > 0 and task["curve_us"][-1][1] == task["best_us"] == report["estimated_total_us"]
    assert task["default_us"] > 0 and task["default_us"] == report["estimated_default_us"]  # the untuned schedule
    assert (tuned / "tuning_curve.png").read_bytes()[:4] == b"\x89PNG"


@slow
def test_compile_applies_log_and_matches_onnxruntime(capsys, tmp_path, monkeypatch, model, tuned, rng):
    """compile finds tuning_logs/cpu/<model key>/ by itself, the kernel takes the log's best schedule, and the
    result still matches onnxruntime (the recorded default made slow: 8 trials need not beat it)."""
    report = json.loads((tuned / "tuning_report.json").read_text())
    _with_default(tuned, tmp_path / "tuning_logs" / "cpu" / report["model_key"], 1e9)
    monkeypatch.chdir(tmp_path)
    r = run_cli(capsys, "compile", model, "--target", "cpu", "-o", "tuned.tvmpkg")
    assert r.code == 0 and "1 kernels tuned" in r.out, r.out + r.err
    m = _manifest(tmp_path / "tuned.tvmpkg")
    assert m["kernels"] == {"fused_matmul_relu": "tuned"}
    assert m["tuning_log"]["model_key"] == report["model_key"] and m["tuning_log"]["records"] == 8
    assert run_cli(capsys, "compile", model, "--target", "cpu", "-o", "plain.tvmpkg", "--no-tuning-log").code == 0
    assert _manifest(tmp_path / "plain.tvmpkg")["kernels"] == {"fused_matmul_relu": "default"}

    from compiler import load, pipeline, tuning

    prep = pipeline.prepare(model, "cpu")
    default = prep.mod["fused_matmul_relu"]
    mod, _, _ = tuning.apply(prep.mod, prep.target, tmp_path / "tuning_logs" / "cpu" / report["model_key"])
    best = _database(tuned).get_all_tuning_records()[0]  # fastest first
    expected = best.as_measure_candidate().sch.mod["main"].without_attr("global_symbol")
    assert tvm_ffi.structural_equal(mod["fused_matmul_relu"], expected.with_attr("tirx.is_scheduled", True))
    assert not tvm_ffi.structural_equal(mod["fused_matmul_relu"].body, default.body, map_free_vars=True)

    x = rng.standard_normal((24, 40))
    ref = ort_run(model, {"x": x})["y"]
    for pkg in ("tuned.tvmpkg", "plain.tvmpkg"):
        assert rel_err(load(tmp_path / pkg)(x=x)["y"], ref) < 1e-5


@slow
def test_log_slower_than_the_default_is_not_applied(capsys, tmp_path, model, tuned, rng):
    """A kernel whose best record does not beat its recorded untuned latency keeps the default schedule; a log
    without that latency (older logs) applies its records as before."""
    slow_log = _with_default(tuned, tmp_path / "slow", 1e-3)
    r = run_cli(capsys, "compile", model, "--target", "cpu", "--tuning-log", slow_log, "-o", tmp_path / "slow.tvmpkg")
    assert r.code == 0 and "0 kernels tuned, 1 kept their default (tuned slower)" in r.out, r.out + r.err
    m = _manifest(tmp_path / "slow.tvmpkg")
    assert m["kernels"] == {"fused_matmul_relu": "default (tuned slower)"}
    assert m["tuning_log"]["tuned_kernels"] == 0 and m["tuning_log"]["kept_default"] == 1

    from compiler import load, pipeline, tuning

    prep = pipeline.prepare(model, "cpu")
    mod, _, _ = tuning.apply(prep.mod, prep.target, slow_log)
    assert tvm_ffi.structural_equal(mod["fused_matmul_relu"], prep.mod["fused_matmul_relu"])

    old_log = _with_default(tuned, tmp_path / "old", None)
    r = run_cli(capsys, "compile", model, "--target", "cpu", "--tuning-log", old_log, "-o", tmp_path / "old.tvmpkg")
    assert r.code == 0 and _manifest(tmp_path / "old.tvmpkg")["kernels"] == {"fused_matmul_relu": "tuned"}

    x = rng.standard_normal((24, 40))
    ref = ort_run(model, {"x": x})["y"]
    assert rel_err(load(tmp_path / "slow.tvmpkg")(x=x)["y"], ref) < 1e-5


@slow
def test_damaged_lines_are_skipped(capsys, tmp_path, model, tuned):
    log = shutil.copytree(tuned, tmp_path / "log")
    lines = _lines(log)
    # a garbage line in the middle, and the last record cut in half as kill -9 in mid-write leaves it
    (log / RECORDS).write_text("\n".join([lines[0], "{not json", *lines[1:-1], lines[-1][: len(lines[-1]) // 2]]))
    with pytest.warns(UserWarning) as seen:
        r = run_cli(capsys, "compile", model, "--target", "cpu", "--tuning-log", log, "-o", tmp_path / "m.tvmpkg")
    assert r.code == 0, r.err
    messages = [str(w.message) for w in seen]
    assert any(f"{RECORDS}:2: not a valid entry" in m for m in messages), messages
    assert any(f"{RECORDS}:9: truncated" in m for m in messages), messages
    assert _manifest(tmp_path / "m.tvmpkg")["tuning_log"]["records"] == 7
    # a tuning job repairs the file before MetaSchedule appends to it (budget reached: nothing to measure)
    with pytest.warns(UserWarning):
        r = run_cli(capsys, "tune", model, "--target", "cpu", "--trials", "7", "--log-dir", log, "--resume")
    assert r.code == 0 and "nothing to do" in r.out, r.err
    assert _lines(log) == lines[:-1]


@slow
def test_damaged_workload_is_an_error(capsys, tmp_path, model, tuned):
    log = shutil.copytree(tuned, tmp_path / "log")
    (log / "database_workload.json").write_text("[1,\n" + (log / "database_workload.json").read_text())
    r = run_cli(capsys, "compile", model, "--target", "cpu", "--tuning-log", log, "-o", tmp_path / "m.tvmpkg")
    assert r.code == 2 and "database_workload.json:1 is not a valid entry" in r.err, r.err


@slow
def test_second_job_on_a_log_is_refused(capsys, model, tuned):
    from compiler import tuning_log

    with tuning_log.locked(tuned):
        r = run_cli(capsys, "tune", model, "--target", "cpu", "--trials", "16", "--log-dir", tuned, "--resume")
    assert r.code == 2 and f"is in use by another tvmpipe job (pid {os.getpid()})" in r.err, r.err
    r = run_cli(capsys, "tune", model, "--target", "cpu", "--trials", "16", "--log-dir", tuned)
    assert r.code == 2 and "already holds 8 tuning records: pass --resume" in r.err, r.err


@slow
def test_compact_keeps_the_best(capsys, tmp_path, model, tuned):
    log = shutil.copytree(tuned, tmp_path / "log")
    before = _database(log).get_all_tuning_records()  # sorted fastest first
    r = run_cli(capsys, "tune", model, "--target", "cpu", "--log-dir", log, "--compact", "--keep", "2")
    assert r.code == 0 and "kept 2 of 8 records" in r.out, r.err
    after = _database(log).get_all_tuning_records()
    assert [str(r.trace) for r in after] == [str(r.trace) for r in before[:2]]
    # the 6 records compacted away still count toward the budget of a resumed job
    r = run_cli(capsys, "tune", model, "--target", "cpu", "--trials", "8", "--log-dir", log, "--resume")
    assert r.code == 0 and "already holds 8 trials" in r.out, r.out + r.err


def test_hand_scheduled_kernels_are_not_tuned(model):
    from compiler import pipeline, tuning, tuning_job

    prep = pipeline.prepare(model, "cpu")
    assert [t.task_name for t in tuning_job.extract(prep)] == ["fused_matmul_relu"]
    gv = prep.mod.get_global_var("fused_matmul_relu")
    prep.mod[gv] = prep.mod[gv].with_attr("tirx.is_scheduled", True)
    assert tuning_job.extract(prep) == []
    assert tuning.apply(prep.mod, prep.target)[1] == {}


def test_tune_argument_errors(capsys, model):
    r = run_cli(capsys, "tune", model, "--target", "cpu")
    assert r.code == 2 and "--trials" in r.err
    r = run_cli(capsys, "tune", model, "--target", "cpu", "--trials", "4", "--rpc", "localhost:1")
    assert r.code == 2 and "needs --rpc-key" in r.err


@slow
def test_kill_9_then_resume_loses_and_remeasures_nothing(capsys, tmp_path, model):
    log = tmp_path / "log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    job = subprocess.Popen([sys.executable, "-m", "compiler", "tune", str(model), "--target", "cpu", "--trials", "12",
                            "--log-dir", str(log)], env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while not (log / RECORDS).exists() or len(_lines(log)) < 4:
        assert job.poll() is None, f"the job ended before it was killed: {job.stderr.read()}"
        assert time.time() < deadline, "no records after 10 minutes"
        time.sleep(0.2)
    job.send_signal(signal.SIGKILL)
    job.wait()
    committed = (log / RECORDS).read_text()
    assert 4 <= len(committed.splitlines()) < 12
    r = run_cli(capsys, "tune", model, "--target", "cpu", "--trials", "12", "--log-dir", log, "--resume")
    assert r.code == 0 and "measuring the untuned schedule" not in r.err, r.err  # the report's value is reused
    assert (log / RECORDS).read_text().startswith(committed.rstrip("\n"))  # nothing committed was lost
    hashes = _schedule_hashes(log)
    assert len(hashes) == 12 and len(set(hashes)) == 12  # nothing measured twice
    assert json.loads((log / "tuning_report.json").read_text())["trials"] == 12


@slow
def test_ctrl_c_stops_after_the_batch_in_flight(capsys, tmp_path, model):
    log = tmp_path / "log"

    def interrupt() -> None:  # as soon as the first batch (8 of 16 trials) is committed
        while not (log / RECORDS).exists() or len(_lines(log)) < 8:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    r = run_cli(capsys, "tune", model, "--target", "cpu", "--trials", "16", "--log-dir", log)
    assert r.code == 130 and "stopping once the batches in flight are measured" in r.err and "interrupted" in r.err
    report = json.loads((log / "tuning_report.json").read_text())
    assert report["status"] == "interrupted" and report["trials"] == 8 == len(_lines(log))
    assert "8 trials" in r.out  # the summary table


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(port: int) -> bool:
    """Whether something listens on localhost:port."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@slow
def test_rpc_tuning_on_localhost(capsys, tmp_path, model):
    """One tracker, two servers: the measurements go through both."""
    port = _free_port()
    py = [sys.executable, "-m"]
    # each serves from a child process: a session of its own lets the test end both (os.killpg)
    tracker_log = open(tmp_path / "tracker.log", "w")
    procs = [subprocess.Popen(py + ["tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                                    "--port-end", str(port + 1)], stderr=tracker_log, start_new_session=True)]
    logs = [tmp_path / f"server{i}.log" for i in range(2)]
    try:
        deadline = time.time() + 120
        while not _accepts(port):
            assert procs[0].poll() is None, (tmp_path / "tracker.log").read_text()
            assert time.time() < deadline, "the RPC tracker did not start listening"
            time.sleep(0.2)
        for path in logs:
            p = _free_port()
            with open(path, "w") as f:
                procs.append(subprocess.Popen(py + ["tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{port}", "--key",
                                                    "test", "--host", "127.0.0.1", "--port", str(p),
                                                    "--port-end", str(p + 1)], stderr=f, start_new_session=True))
        from tvm import rpc

        deadline = time.time() + 120
        while rpc.connect_tracker("127.0.0.1", port).summary()["queue_info"].get("test", {}).get("free", 0) < 2:
            assert time.time() < deadline, "the RPC servers did not register"
            time.sleep(0.5)
        r = run_cli(capsys, "tune", model, "--target", "cpu", "--trials", "8", "--log-dir", tmp_path / "log",
                    "--rpc", f"127.0.0.1:{port}", "--rpc-key", "test")
        assert r.code == 0, r.err
        report = json.loads((tmp_path / "log" / "tuning_report.json").read_text())
        assert report["trials"] == 8 and report["tasks"][0]["errors"] == 0 and report["runner"].startswith("rpc")
        assert report["tasks"][0]["default_us"] > 0  # measured through the same RPC runner
        assert all("load_module" in path.read_text() for path in logs)
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        tracker_log.close()


def test_log_of_the_same_gpu_under_an_arch_specific_target_is_not_warned_about():
    """sm_90 and sm_90a are one GPU (the suffix unlocks wgmma): a log tuned under one applies to the other
    silently; another GPU or another setting still gets the warning."""
    from compiler.tuning import same_gpu

    base = {"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 1024}
    assert same_gpu(base, {**base, "arch": "sm_90a"})
    assert not same_gpu(base, {**base, "arch": "sm_80"})
    assert not same_gpu(base, {**base, "arch": "sm_90a", "max_threads_per_block": 512})
    assert same_gpu({"kind": "llvm", "mcpu": "znver5"}, {"kind": "llvm", "mcpu": "znver5"})
