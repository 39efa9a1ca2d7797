"""Where the zoo's batch-32 float16 GPU rows spend their time: each kernel's GPU microseconds per call, for the
tvmpipe package (``build/zoo/``, called as a user does) and for torch.compile of the same model, through
CUPTI (torch's profiler records the TVM runtime's launches too). Run on the GPU machine after
``benchmarks/models.py --target cuda-sm90 --variants ...``::

    python3 benchmarks/results/rerun/zoo-h100-gemm-bands/kernels.py OUT.json gpt2:32:fp16 ...
"""

import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
from benchmarks.common import cuda_kernel_us  # noqa: E402
from benchmarks.models import MODELS, _to_torch, package_path  # noqa: E402
from compiler.runtime import load  # noqa: E402

CALLS = 10


def kernel_us(fn) -> dict[str, dict]:
    """Per kernel name: GPU us per call of ``fn`` and launches per call, over CALLS calls back to back."""
    return cuda_kernel_us(fn, CALLS, width=120)


def main(out: Path, variants: list[str]) -> None:
    records = []
    for model, batch, precision in (v.split(":") for v in variants):
        batch = int(batch)
        x = MODELS[model].example(batch)
        runner = load(package_path(model, batch, "cuda-sm90", precision, True))
        ours = kernel_us(lambda: runner(**x))  # with its input and output copies (Memcpy rows)
        net = MODELS[model].build().cuda().to(torch.float16 if precision == "fp16" else torch.float32)
        xs = [_to_torch(a, next(net.parameters()).dtype) for a in x.values()]
        with torch.no_grad():
            compiled = torch.compile(net)
            theirs = kernel_us(lambda: compiled(*xs))
        rec = {"model": model, "batch": batch, "precision": precision,
               "tvmpipe_total_us": sum(k["us"] for k in ours.values()),
               "torch_compile_total_us": sum(k["us"] for k in theirs.values()),
               "tvmpipe": ours, "torch_compile": theirs}
        print(f"{model} b{batch} {precision}: kernels sum tvmpipe {rec['tvmpipe_total_us']:.0f} us, "
              f"torch.compile {rec['torch_compile_total_us']:.0f} us", flush=True)
        for name, k in list(ours.items())[:12]:
            print(f"   ours   {k['us']:9.1f} us x{k['launches']:.0f}  {name}")
        for name, k in list(theirs.items())[:12]:
            print(f"   torch  {k['us']:9.1f} us x{k['launches']:.0f}  {name}")
        records.append(rec)
        out.write_text(json.dumps(records, indent=1))
        torch._dynamo.reset()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
