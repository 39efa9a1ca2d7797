# device call 2 (after build/q1.sh, same warm machine): carry build/cpack/part.ab .devpack/setup.sh .devpack/runtime.tar.xz .devpack/xgboost.tar.xz build/q2.sh
# the compiler; the GPU zoo's batch-32 fp16 rows with this checkout (README's table predates the TMA GEMMs)
set -u
cat /opt/cpack/part.aa build/cpack/part.ab > .devpack/compiler.xz && . .devpack/setup.sh; export PYTHONPATH=$PWD:${PYTHONPATH:-}
nvidia-smi --query-gpu=name --format=csv,noheader
V="gpt2:32:fp16 bert_base:32:fp16 vit_b_16:32:fp16 resnet50:32:fp16"
mkdir -p $OUT/z; timeout 500 python3 benchmarks/models.py --target cuda-sm90 --variants $V --jobs 4 --out $OUT/z > $OUT/z/models.log 2>&1; echo "models rc $?" >> $OUT/z/models.log
grep -E "tvmpipe|rc " $OUT/z/models.log | tail -n 8
