# device call 2 (after build/tma2.sh, same warm machine): the compiler; the zoo's batch-32 fp16 rows with the TMA rule
# and their A/B against main 533a350 (build/old9: the TMA kernel in, not in the rule)
# carry: build/cpack/part.ab .devpack/setup.sh .devpack/runtime.tar.xz .devpack/xgboost.tar.xz build/old9 build/tma3.sh
set -u
cat /opt/cpack/part.aa build/cpack/part.ab > .devpack/compiler.xz && . .devpack/setup.sh; export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name --format=csv,noheader
V="gpt2:32:fp16 bert_base:32:fp16 vit_b_16:32:fp16 resnet50:32:fp16"
mkdir -p $OUT/z; timeout 250 python3 benchmarks/models.py --target cuda-sm90 --variants $V --jobs 4 --out $OUT/z > $OUT/z/models.log 2>&1; echo "models rc $?" >> $OUT/z/models.log
grep -E "tvmpipe|rc " $OUT/z/models.log | tail -n 6
timeout 300 python3 benchmarks/gpu_ab.py build/old9 $OUT/ab.json $V > $OUT/ab.log 2>&1; echo "ab rc $?" >> $OUT/ab.log
grep -v Warn $OUT/ab.log | tail -n 6
