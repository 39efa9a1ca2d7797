"""CUDA packages are built here without a GPU and carry compiled GPU code (no compiler needed to load)."""

import json
import struct
import subprocess
import sys
import zipfile

import pytest

from helpers import run_cli

EM_CUDA = 190


def cuda_elf_archs(blob: bytes) -> list[int]:
    """SM versions of the CUDA ELF images (cubins) embedded anywhere in ``blob``."""
    archs, i = [], blob.find(b"\x7fELF")
    while i >= 0:
        if struct.unpack_from("<H", blob, i + 18)[0] == EM_CUDA:
            flags = struct.unpack_from("<I", blob, i + 48)[0]
            archs.append((flags >> 8) & 0xFF)  # EF_CUDA_SM in bits 8-15 (CUDA >= 12.8)
        i = blob.find(b"\x7fELF", i + 1)
    return archs


@pytest.fixture(scope="module")
def cuda_pkg(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cuda")
    from compiler.cli import main

    assert main(["compile", "models/demo.onnx", "--target", "cuda-sm90", "--input-shape", "image:2x3x32x32",
                 "-o", str(tmp / "demo.tvmpkg")]) == 0
    return tmp / "demo.tvmpkg"


def test_cuda_package_holds_sm90_cubin_and_no_source(cuda_pkg):
    with zipfile.ZipFile(cuda_pkg) as zf:
        lib = zf.read("model.so")
        manifest = json.loads(zf.read("manifest.json"))
    assert 90 in cuda_elf_archs(lib), "no sm_90a cubin in the package"
    assert b"__global__" not in lib and b"extern \"C\"" not in lib, "CUDA source left in the package"
    assert manifest["gpu_code"]["images"][0] == "sm_90a cubin"
    assert manifest["target"]["arch"] == "sm_90a" and manifest["target"]["sms"] == 132 and manifest["kernels"]
    if manifest["gpu_code"]["format"] == "fatbin":
        assert struct.pack("<I", 0xBA55ED50) in lib  # fatbin magic: the PTX rides along for newer GPUs


def test_sm80_target_builds_sm80_cubin(capsys, tmp_path):
    r = run_cli(capsys, "compile", "models/demo.onnx", "--target", "cuda-sm80", "--input-shape", "image:1x3x32x32",
                "-o", tmp_path / "a100.tvmpkg")
    assert r.code == 0, r.err
    with zipfile.ZipFile(tmp_path / "a100.tvmpkg") as zf:
        assert cuda_elf_archs(zf.read("model.so")) == [80]


def test_cpu_package_loads_with_runtime_only(tmp_path):
    """A fresh process with TVM's runtime library only (no compiler, no onnx) runs a package."""
    from compiler.cli import main

    pkg = tmp_path / "demo.tvmpkg"
    assert main(["compile", "models/demo.onnx", "--target", "cpu", "--input-shape", "image:1x3x32x32", "-o", str(pkg)]) == 0
    code = (
        "import sys, compiler\n"
        f"r = compiler.load({str(pkg)!r})\n"
        "out = r(**r.random_inputs())['probs']\n"
        "assert out.shape == (1, 10) and abs(out.sum() - 1) < 1e-5\n"
        "import tvm; assert tvm.base._RUNTIME_ONLY\n"
        "assert 'tvm.relax' not in sys.modules and 'onnx' not in sys.modules, 'compiler side imported'\n"
    )
    env = {"TVM_USE_RUNTIME_LIB": "1", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=".")
    assert r.returncode == 0, r.stderr


def test_unscheduled_gpu_kernel_is_refused():
    """A kernel no rule scheduled would compile to host code for CUDA and crash at run time: refuse."""
    import tvm
    from tvm import relax, te

    from compiler.build import build
    from compiler.targets import resolve

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(bb.call_te(lambda a: te.compute((8,), lambda i: a[i] * 2.0, name="double"), x))
        bb.emit_func_output(y)
    mod = bb.get()
    for gv, f in mod.functions.items():
        if isinstance(f, tvm.tirx.PrimFunc):
            mod[gv] = f.with_attr("tirx.is_scheduled", True)
    with pytest.raises(RuntimeError, match="no thread binding"):
        build(mod, resolve("cuda-sm90"))


CUBE = 'extern "C" __global__ void cube(float* x) { x[threadIdx.x] = powf(x[threadIdx.x], 3.0f); }'


def test_cuda_code_is_compiled_without_fast_math(monkeypatch):
    """TVM's NVRTC path always passes --use_fast_math, which makes powf exp2(y*log2 x): NaN for x < 0 (GPT-2's
    tanh GELU computes pow(x, 3) and gave NaN on the H200). Packages must be compiled with exact math."""
    from cuda.bindings import nvrtc
    from tvm.support import nvcc

    from compiler import cuda_binary

    options, real = [], nvrtc.nvrtcCompileProgram
    monkeypatch.setattr(nvrtc, "nvrtcCompileProgram", lambda prog, n, opts: (options.append(opts), real(prog, n, opts))[1])
    cuda_binary.compile_source(CUBE, "sm_90")
    assert len(options) == 2 and not any(b"--use_fast_math" in o for o in options)
    monkeypatch.setattr(nvrtc, "nvrtcCompileProgram", real)
    fast = bytes(nvcc.compile_cuda(CUBE, target_format="ptx", arch="sm_90", compiler="nvrtc")).decode()
    with cuda_binary.exact_math():
        exact = bytes(nvcc.compile_cuda(CUBE, target_format="ptx", arch="sm_90", compiler="nvrtc")).decode()
    assert "lg2.approx" in fast and "lg2.approx" not in exact  # __powf's log2 approximation is gone
    assert nvrtc.nvrtcCompileProgram is real


def test_cuda_compiled_by_tvm_itself_is_exact(monkeypatch, tmp_path):
    """Where TVM's CUDA compile callback is registered (importing tvm.support.nvcc does it, as on the GPU
    machine), tvm.compile compiles the kernels itself: that must be without fast math too."""
    import onnx
    from cuda.bindings import nvrtc
    from onnx import TensorProto, helper
    from tvm.support import nvcc  # noqa: F401  registers tvm_callback_cuda_compile

    from compiler.pipeline import compile_model

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 37])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 37])
    graph = helper.make_graph([helper.make_node("Pow", ["x", "three"], ["y"])], "cube", [x], [y],
                              [helper.make_tensor("three", TensorProto.FLOAT, [], [3.0])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "cube.onnx")
    options, real = [], nvrtc.nvrtcCompileProgram
    monkeypatch.setattr(nvrtc, "nvrtcCompileProgram", lambda prog, n, opts: (options.append(opts), real(prog, n, opts))[1])
    compile_model(str(tmp_path / "cube.onnx"), "cuda-sm90", tmp_path / "cube.tvmpkg")
    assert options and not any(b"--use_fast_math" in o for o in options)


def test_tuning_measures_exactly_compiled_cuda(monkeypatch, tmp_path):
    """MetaSchedule's candidates are exported as packages are: compiled here by NVRTC without fast math (left as
    source, TVM would compile them at load with it), so tuning times the code that ships."""
    import tarfile

    import tvm
    from cuda.bindings import nvrtc
    from tvm import te, topi

    from tvm.s_tir import meta_schedule as ms

    from compiler import tuning_job
    from compiler.targets import resolve

    x = te.placeholder((3, 37), "float32", name="x")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, topi.power(x, 3.0)]))
    bx, tx = sch.split(sch.fuse(*sch.get_loops(sch.get_sblock("T_power"))), [None, 64])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    options, real = [], nvrtc.nvrtcCompileProgram
    monkeypatch.setattr(nvrtc, "nvrtcCompileProgram", lambda prog, n, opts: (options.append(opts), real(prog, n, opts))[1])
    info = resolve("cuda-sm90")
    mod = tvm.IRModule({"main": sch.mod["main"]})
    artifact = tuning_job._export_compiled(tuning_job._build(mod, info.target, None), info.spec, info.arch)
    assert options and not any(b"--use_fast_math" in o for o in options)
    with tarfile.open(artifact) as tf:
        assert "devc.o" in tf.getnames()  # the library's imports, the compiled device code among them
    # and the builder tuning uses, in its worker processes
    (result,) = tuning_job._builder(info, False, 1).build([ms.builder.BuilderInput(mod, info.target)])
    assert result.error_msg is None and result.artifact_path.endswith(".tar"), result.error_msg


@pytest.mark.parametrize("arch, images, have, runs", [
    ("sm_90a", ["sm_90a cubin", "compute_90a ptx"], 90, True),
    ("sm_90a", ["sm_90a cubin", "compute_90a ptx"], 100, False),  # wgmma PTX is for sm_90 only
    ("sm_90a", ["sm_90a cubin"], 80, False),
    ("sm_80", ["sm_80 cubin", "compute_80 ptx"], 90, True),  # portable PTX runs on later GPUs
    ("sm_80", ["sm_80 cubin", "compute_80 ptx"], 100, True),  # compared as numbers, not strings
    ("sm_80", ["sm_80 cubin"], 90, False),
    ("sm_90", ["sm_90 cubin", "compute_90 ptx"], 80, False),
])
def test_gpu_code_runs_where_its_arch_allows(arch, images, have, runs):
    from compiler.runtime import gpu_code_runs

    assert gpu_code_runs(arch, images, have) is runs


def split_blocks(mod) -> list[int]:
    """blockIdx.x extents of the scheduled softmax kernels in ``mod`` (from their TVMScript)."""
    import re

    import tvm

    return [int(n) for gvar, func in mod.functions.items()
            if "softmax" in gvar.name_hint and isinstance(func, tvm.tirx.PrimFunc)
            for n in re.findall(r'thread_binding\((\d+), thread="blockIdx.x"\)', func.script())]


def test_target_sm_count_plans_the_kernels(capsys, tmp_path):
    """A target file's "sms" (an H100 PCIe's, say) reaches the launch plans and the manifest: a split softmax row,
    whose blocks must all be resident, takes no more blocks than that; without it, the arch's 132."""
    from helpers import make_model, save
    from onnx import TensorProto, helper

    from compiler import pipeline

    spec = json.loads(open("targets/cuda-sm90.json").read())
    (tmp_path / "gpu40.json").write_text(json.dumps({**spec, "sms": 40}))
    x, y = ("x", TensorProto.FLOAT, [8, 1 << 18]), ("y", TensorProto.FLOAT, [8, 1 << 18])
    model = save(make_model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [x], [y]), tmp_path / "softmax.onnx")
    assert split_blocks(pipeline.prepare(model, "cuda-sm90").mod) == [8 * 16]  # 132 // 8 chunks a row
    prep = pipeline.prepare(model, str(tmp_path / "gpu40.json"))
    assert prep.target.sms == 40 and prep.target.isa_summary() == "sm_90a, 40 SMs"
    assert split_blocks(prep.mod) == [8 * 5]
    (tmp_path / "bad.json").write_text(json.dumps({**spec, "sms": "many"}))
    r = run_cli(capsys, "compile", model, "--target", tmp_path / "bad.json")
    assert r.code != 0 and "bad.json" in r.err and '"sms" must be the GPU\'s SM count' in r.err


def test_sm_count_mismatch_is_reported():
    from compiler.runtime import sm_mismatch

    assert sm_mismatch({"name": "cuda-sm90", "sms": 132}, 132) is None
    assert sm_mismatch({"name": "cuda-sm90"}, 114) is None  # a package from before "sms" was recorded
    said = sm_mismatch({"name": "cuda-sm90", "sms": 132}, 114)
    assert "132 SMs" in said and "has 114" in said and '"sms": 114' in said
