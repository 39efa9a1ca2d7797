# device call 1 (kind nvidia-h200): carry .devpack/setup.sh .devpack/runtime.tar.xz build/gpu/softmax build/gpu/attention build/cpack/part.aa build/q1.sh
# On an H200: the softmax and attention tables (#4, #5). On any GPU: the compiler's first half into /opt/cpack for call 2.
set -u
mkdir -p /opt/cpack && cp build/cpack/part.aa /opt/cpack/
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$name"
if ! echo "$name" | grep -q H200; then exit 0; fi
. .devpack/setup.sh > /dev/null; export PYTHONPATH=$PWD:${PYTHONPATH:-}
mkdir -p $OUT/sm $OUT/att
timeout 200 python3 benchmarks/softmax.py --run --out $OUT/sm > $OUT/sm/softmax.log 2>&1; echo "softmax rc $?" >> $OUT/sm/softmax.log
tail -n 4 $OUT/sm/softmax.log
timeout 340 python3 benchmarks/attention.py --run --out $OUT/att > $OUT/att/attention.log 2>&1; echo "attention rc $?" >> $OUT/att/attention.log
tail -n 4 $OUT/att/attention.log
