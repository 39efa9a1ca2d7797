"""benchmarks/softmax_phases.py stamps the rule's streamed softmax kernel at its phase boundaries (the GPU runs it;
here the text edit on a freshly generated kernel, and nvcc's verdict on it where nvcc exists)."""

import shutil
import subprocess

import pytest

from benchmarks import softmax_phases
from compiler import targets
from schedules import softmax as S

STAMP = "%%globaltimer;\" : \"=l\"(stamp_t[{}])"


@pytest.mark.parametrize("rows, cols, dtype", [(200, 40001, "float32"), (16, 1 << 20, "float16")])
def test_stamps_mark_the_phases_of_a_generated_kernel(rows, cols, dtype, tmp_path):
    plan = S.cuda_plan(rows, cols, dtype, "sm_90")
    assert plan.cache == "l2" and (plan.chunks > 1) == (rows < 66)  # streamed; the split for the few rows
    target = targets.resolve("cuda-sm90").target
    lib, smem = softmax_phases.compile_with_dyn_shmem(S.schedule_cuda(rows, cols, dtype, "softmax", plan).mod, target)
    keep = plan.cached * plan.per_thread * plan.lanes * 16  # the row's cached part: 16-byte vectors per thread
    assert keep < smem <= min(keep + 1024, 227 << 10)  # and the block reduction's few words; one SM's limit
    out = softmax_phases.stamped(lib.mod.imports[0].inspect_source())
    at = [out.index(STAMP.format(i)) for i in range(4)]
    assert at == sorted(at) and all(out.count(STAMP.format(i)) == 1 for i in range(4))
    entry, first_reduce, pass2 = (out.index(s) for s in ("buf_dyn_shmem", "__shfl_xor_sync", "for (int ti = 0;"))
    assert at[0] < entry < at[1] < first_reduce and at[1] < at[2] < pass2 < at[3]
    assert out.count("unsigned long long* __restrict__ stamps_ptr)") == 2  # the declaration and the definition
    assert out.replace(softmax_phases._WRITE % (softmax_phases._STAMP % 3), "").count("stamps_ptr") == 2
    if shutil.which("nvcc"):
        (tmp_path / "k.cu").write_text(out)
        done = subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-w", "-o", tmp_path / "k.cubin", tmp_path / "k.cu"],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]


def test_a_kernel_without_the_expected_structure_is_refused():
    with pytest.raises(ValueError, match="structure"):
        softmax_phases.stamped('extern "C" __global__ void k() {}\n')
