for m in "squeezenet1_0 64" "alexnet 96" "vgg11 64" "googlenet 64" "inception_v3 96" "densenet121 64" "shufflenet_v2_x0_5 64" "mnasnet0_5 64" "mobilenet_v3_small 64" "efficientnet_b0 64" "efficientnet_v2_s 64" "regnet_y_400mf 64" "resnext50_32x4d 64" "convnext_tiny 64" "swin_t 64" "swin_v2_t 64" "maxvit_t 224" "vit_b_16 224" "seg:lraspp_mobilenet_v3_large 64" "seg:deeplabv3_mobilenet_v3_large 64" "seg:fcn_resnet50 64" "vid:r3d_18 32" "vid:s3d 64"; do
  set -- $m; timeout 900 /work/main/.venv/bin/python probe.py $1 $2 2>err_$1.log | tail -1 >> results.jsonl || echo "{\"model\": \"$1\", \"rc\": $?}" >> results.jsonl
done
echo done >> results.jsonl
