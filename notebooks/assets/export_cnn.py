"""Export the small ResNet that notebook 01 compiles, with PyTorch's own ONNX exporter.

    pip install torch==2.13.0 onnxscript      # CPU build; not a tvmpipe dependency (about 1 GB)
    python notebooks/assets/export_cnn.py     # rewrites small_resnet.onnx and small_resnet_ts.onnx here

The files are committed so the notebooks (and CI) need no PyTorch. They are what users bring: one model
(dynamic batch, BatchNorm in inference mode, ``x.view(x.size(0), -1)`` before the classifier) exported
twice, by today's default exporter (``torch.export`` based, "dynamo") and by the TorchScript exporter
that wrote most ONNX files in circulation (deprecated since PyTorch 2.9, still shipped). Weights are
seeded random (the notebook is about compiling, not accuracy), with non-trivial BatchNorm statistics so
folding them is a real computation.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent


class Block(nn.Module):
    """ResNet basic block: two 3x3 conv-BN, a 1x1 projection shortcut when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.short(x))


class SmallResNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layers = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.layers(self.stem(x)))
        return self.fc(x.view(x.size(0), -1))


def main() -> None:
    torch.manual_seed(0)
    model = SmallResNet().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.8, 1.2)
                m.bias.uniform_(-0.1, 0.1)
    example = (torch.randn(2, 3, 32, 32),)
    names = {"input_names": ["image"], "output_names": ["logits"]}
    torch.onnx.export(model, example, HERE / "small_resnet.onnx", **names,
                      dynamic_shapes={"x": {0: torch.export.Dim("batch")}}, external_data=False)
    torch.onnx.export(model, example, HERE / "small_resnet_ts.onnx", **names, dynamo=False, opset_version=17,
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    for f in ("small_resnet.onnx", "small_resnet_ts.onnx"):
        print(f"wrote {HERE / f} ({(HERE / f).stat().st_size} bytes) with torch {torch.__version__}")


if __name__ == "__main__":
    main()
