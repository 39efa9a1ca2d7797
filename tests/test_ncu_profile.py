"""benchmarks.common.ncu_profile reads Nsight Compute's CSV (the GPU machine's profilers; here on canned output)."""

import subprocess

from benchmarks import common

HEADER = '"ID","Process ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"'


def csv_output(launches: dict[str, dict[str, str]]) -> str:
    rows = [f'"{i}","7","{kernel}","s","{name}","u","{value}"'
            for i, (kernel, metrics) in enumerate(launches.items()) for name, value in metrics.items()]
    return "\n".join(["==PROF== Connected to process 7", HEADER, *rows, "==PROF== Disconnected"])


def metrics(duration: str, stalls: dict[str, str], pipes: dict[str, str] | None = None) -> dict[str, str]:
    base = {name: "1" for _, name in common.NCU_METRICS}
    base["Duration"] = duration
    return (base | {f"smsp__average_warps_issue_stalled_{k}_per_issue_active.ratio": v for k, v in stalls.items()}
            | {f"sm__{k}.avg.pct_of_peak_sustained_active": v for k, v in (pipes or {}).items()})


def test_ncu_profile_parses_launches_and_stall_reasons(monkeypatch):
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        out = csv_output({"k_a": metrics("1,234.5", {"barrier": "0.5", "wait": "2.25", "drain": "0.01"},
                                         {"inst_executed_pipe_xu": "41.5", "pipe_tensor_op_gmma_cycles_active": "63",
                                          "inst_executed_pipe_xu_realtime": "41.5", "inst_executed_pipe_uniform": "0.3",
                                          "inst_executed_pipe_lsu_realtime": "7"}),
                          "k_b": metrics("99", {})})
        return subprocess.CompletedProcess(cmd, 0, out, "")

    monkeypatch.setattr(common.subprocess, "run", run)
    got = common.ncu_profile("regex:k_", ["script.py", "--launch"])
    assert [g["kernel"] for g in got] == ["k_a", "k_b"]
    assert got[0]["duration_ns"] == 1234.5 and got[1]["duration_ns"] == 99
    assert list(got[0]["stalls"].items()) == [("wait", 2.25), ("barrier", 0.5)]  # largest first, tiny ones dropped
    assert got[1]["stalls"] == {}
    # (same; a "_realtime" twin of a pipe dropped, one without a twin kept)
    assert list(got[0]["pipes"].items()) == [("tensor_op_gmma_cycles_active", 63), ("xu", 41.5), ("lsu_realtime", 7)]
    assert got[1]["pipes"] == {}
    assert calls[0][:2] == ["ncu", "--csv"] and "regex:k_" in calls[0] and calls[0][-2:] == ["script.py", "--launch"]
    assert "1.2 us" in common.ncu_line(got[0]) and "'xu': 41.5" in common.ncu_line(got[0])
    assert common._PIPES in calls[0][calls[0].index("--metrics") + 1].split(",")


def test_ncu_profile_retries_without_stall_metrics(monkeypatch, capsys):
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        if len(calls) == 1:
            return subprocess.CompletedProcess(cmd, 1, "", "==ERROR== Failed to find metric regex:...")
        return subprocess.CompletedProcess(cmd, 0, csv_output({"k": metrics("5", {})}), "")

    monkeypatch.setattr(common.subprocess, "run", run)
    (got,) = common.ncu_profile("k", ["s.py"])
    assert got["duration_ns"] == 5 and got["stalls"] == {}
    assert "regex:^smsp" in calls[0][calls[0].index("--metrics") + 1]
    assert "regex" not in calls[1][calls[1].index("--metrics") + 1]
    assert "without them" in capsys.readouterr().out
