# device call: carry .devpack/setup.sh .devpack/runtime.tar.xz build/run11 build/gpu/matmul-tma build/tma1.sh
# On an H200: the queued softmax + attention tables (build/run11/run.sh); else the GEMM benchmark with the TMA variants.
set -u
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$name"
if echo "$name" | grep -q H200; then bash build/run11/run.sh; exit; fi
. .devpack/setup.sh > /dev/null; export PYTHONPATH=$PWD:$PYTHONPATH
timeout 450 python3 benchmarks/matmul.py --run --dir build/gpu/matmul-tma --shapes "gpt2 b32" square "resnet50 b32 conv " --out $OUT/m > $OUT/matmul.log 2>&1; echo "matmul rc $?" >> $OUT/matmul.log
grep -v Warn $OUT/matmul.log | grep -E "^ *(tvmpipe|torch) |t$|rc " | cut -c1-150 | tail -n 90
