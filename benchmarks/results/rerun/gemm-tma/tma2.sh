# device call 1: carry build/cpack/part.aa .devpack/setup.sh .devpack/runtime.tar.xz build/gpu/matmul-rule build/gpu/matmul-tma build/tma2.sh
# the compiler's first half into /opt/cpack (build/tma3.sh next, at once); the GEMM benchmark with the TMA rule, the
# rule before (533a350: build/gpu/matmul-tma's tvmpipe kernels) beside it
mkdir -p /opt/cpack && cp build/cpack/part.aa /opt/cpack/
nvidia-smi --query-gpu=name --format=csv,noheader
. .devpack/setup.sh > /dev/null; export PYTHONPATH=$PWD:$PYTHONPATH
timeout 200 python3 benchmarks/matmul.py --run --dir build/gpu/matmul-rule --baseline build/gpu/matmul-tma --shapes "gpt2 b32" square "resnet50 b32 conv " --out $OUT/m > $OUT/matmul.log 2>&1; echo "matmul rc $?" >> $OUT/matmul.log
grep -v Warn $OUT/matmul.log | grep -E "^ *(tvmpipe|tvmpipe-baseline|torch) |rc " | cut -c1-150 | tail -n 60
