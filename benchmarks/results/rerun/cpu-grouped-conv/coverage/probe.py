import sys, json, time, traceback
from pathlib import Path
import numpy as np
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[5]))
import torch, torchvision
from torchvision import models as M

name, size = sys.argv[1], int(sys.argv[2])
work = Path("/tmp/tvp"); work.mkdir(exist_ok=True)
torch.manual_seed(0)
if name.startswith("seg:"):
    net = getattr(M.segmentation, name[4:])(weights=None, weights_backbone=None, num_classes=5, aux_loss=False)
elif name.startswith("vid:"):
    net = getattr(M.video, name[4:])(weights=None)
else:
    net = getattr(M, name)(weights=None)
net = net.eval()
shape = (1, 3, 8, size, size) if name.startswith("vid:") else (1, 3, size, size)
x = torch.randn(*shape)
class W(torch.nn.Module):
    def __init__(s): super().__init__(); s.n = net
    def forward(s, x):
        y = s.n(x)
        return y["out"] if isinstance(y, dict) else y
p = work / f"{name.replace(':','_')}.onnx"
rec = {"model": name}
try:
    t0 = time.perf_counter()
    torch.onnx.export(W(), (x,), p, input_names=["x"], output_names=["y"], dynamo=True)
    rec["export_s"] = round(time.perf_counter() - t0, 1)
except Exception as e:
    rec["export_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    print(json.dumps(rec)); sys.exit(0)
from compiler import compile_model, load
from compiler.compare import OrtSession
try:
    t0 = time.perf_counter()
    man = compile_model(p, "cpu", work / f"{name.replace(':','_')}.tvmpkg")
    rec["compile_s"] = round(time.perf_counter() - t0, 1)
    from collections import Counter
    rec["kernels"] = dict(Counter(man["kernels"].values()))
    r = load(str(work / f"{name.replace(':','_')}.tvmpkg"))
    xi = np.random.default_rng(1).standard_normal(shape).astype("float32")
    ours = r(x=xi)["y"]; ref = OrtSession(p, threads=2)({"x": xi})["y"]
    rec["rel_err"] = float(np.abs(ours - ref).max() / np.abs(ref).max())
except BaseException as e:
    rec["error"] = f"{type(e).__name__}: {str(e)[:600]}"
print(json.dumps(rec))
