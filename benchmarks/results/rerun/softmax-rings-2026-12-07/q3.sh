# device call: carry .devpack/setup.sh .devpack/runtime.tar.xz build/gpu/softmax build/gpu/softmax-ring1024 build/gpu/softmax-cluster build/q3.sh
# The few-long-rows shapes on the H200 side by side: the rule (rings, float16 in 512-thread blocks) against the
# 1024-thread ring's build (b14b49b) and the cluster rule's (f3e73ee), 8 interleaved rounds.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
. .devpack/setup.sh > /dev/null; export PYTHONPATH=$PWD:${PYTHONPATH:-}
mkdir -p $OUT/sm
timeout 400 python3 benchmarks/softmax.py --run --out $OUT/sm --baseline build/gpu/softmax-ring1024 build/gpu/softmax-cluster --shapes 16x1048576 128x131072 > $OUT/sm/softmax.log 2>&1; echo "softmax rc $?" >> $OUT/sm/softmax.log
tail -n 3 $OUT/sm/softmax.log
