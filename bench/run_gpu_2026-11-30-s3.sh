#!/usr/bin/env bash
# Session 3 GPU measurements of issue 9 (bench/reports/2026-11-30-s3-gpu.md), device kind
# nvidia-h200-x2, from the repo root:
#
#   bash bench/run_gpu_2026-11-30-s3.sh call1   # two one-GPU lanes, then both GPUs:
#       GPU 0: whole-model compile with max-autotune (Triton GEMM templates, epilogue fusion)
#       GPU 1: one-GPU references (layers compiled, with / without the DDP wrapper), anchor
#       both:  TP = 2 + SP with async TP / tp_comm_overlap / plain (profiled); DP = 2 profiled
#              (NCCL kernels hidden or exposed), DP = 2 with a high-priority NCCL stream
#   bash bench/run_gpu_2026-11-30-s3.sh call2   # TP = 2 + SP whole-model compile / CUDA graphs,
#                                               # DP = 2 with CUDA graphs, one-GPU references
#   bash bench/run_gpu_2026-11-30-s3.sh call3   # references + anchors in two lanes, then TP = 2
#                                               # NCCL protocol/channels, comm reorder; DP = 2
#   bash bench/run_gpu_2026-11-30-s3.sh call4   # tests/gpu, PP / CP bench layouts on 2 GPUs
#   bash bench/run_gpu_2026-11-30-s3.sh next    # NOT RUN YET (device time spent): TP = 2 + SP
#       with --no-memory-reorder (± --tp-comm-overlap, now also pipelining the row-parallel
#       reduce-scatter), layers compiled with --tp-comm-overlap, DP = 2 again, PP / CP layouts
#
# Results: one JSON object a line in $OUT/results.jsonl; logs, profiles, traces in $OUT.
source bench/_run_lib.sh

T="torchrun --nproc-per-node 2 --master-port 29651 bench/bench_gpt.py"
L13="--config gpt-1.3b $NC"

c1_gpu0() {
  export CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29601
  run autotune.log 290 $B $L13 --compile model --ce chunked-recompute \
    --compile-mode max-autotune-no-cudagraphs --label fast-model-max-autotune
}

c1_gpu1() {
  export CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29611
  run refs.log 120 $B $L13 --label fast-nochecks
  run refs.log 120 $B $L13 --ddp on --overlap-grad-reduce --label fast-ddp-wrapper-1gpu
  run refs.log 150 $B $L13 --compile model --ce chunked-recompute --label fast-compile-model-ce-recompute
  run anchors.log 150 python3 $A/torch_baseline_bench.py gpt-1.3b compile
}

c1_two() {
  unset CUDA_VISIBLE_DEVICES
  run tp.log 110 $T $L13 --tp 2 --sp --async-tp --label fast-tp2-sp-async-tp \
    --profile "$OUT/profile-tp2-async.json"
  run dp.log 100 $T $L13 --overlap-grad-reduce --label fast-dp2-overlap-profiled \
    --profile "$OUT/profile-dp2.json" --trace "$OUT/trace-dp2.json.gz"
  run tp.log 90 $T $L13 --tp 2 --sp --label fast-tp2-sp-profiled \
    --profile "$OUT/profile-tp2.json" --trace "$OUT/trace-tp2.json.gz"
  TORCH_NCCL_HIGH_PRIORITY=1 run dp.log 80 $T $L13 --overlap-grad-reduce \
    --label fast-dp2-overlap-nccl-high-priority
  run tp.log 80 $T $L13 --tp 2 --sp --tp-comm-overlap --label fast-tp2-sp-tp-comm-overlap
}

c2_two() {  # TP = 2 + SP launch-bound (GPU idle around each collective): fewer graphs, CUDA graphs
  unset CUDA_VISIBLE_DEVICES
  local RO="--compile-mode reduce-overhead"
  run tp.log 120 $T $L13 --tp 2 --sp --compile model --label fast-tp2-sp-compile-model
  run tp.log 120 $T $L13 --tp 2 --sp --compile model $RO --label fast-tp2-sp-compile-model-cudagraphs
  run tp.log 90 $T $L13 --tp 2 --sp $RO --label fast-tp2-sp-layers-cudagraphs
  run dp.log 90 $T $L13 --overlap-grad-reduce --bucket-size 100000000 $RO \
    --label fast-dp2-overlap-bucket100m-cudagraphs
  export CUDA_VISIBLE_DEVICES=0
  run refs.log 80 $B $L13 $RO --label fast-layers-cudagraphs
  run refs.log 80 $B $L13 --label fast-nochecks
}

c3_gpu0() {  # one-GPU references of the two-GPU ratios
  export CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29701
  run refs.log 80 $B $L13 --compile-mode reduce-overhead --label fast-layers-cudagraphs
  run refs.log 120 $B $L13 --compile model --ce chunked-recompute --label fast-compile-model-ce-recompute
  run refs.log 80 $B $L13 --label fast-nochecks
}

c3_gpu1() {  # anchors and gpt-125m
  export CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29711
  for c in gpt-1.3b gpt-125m; do run anchors.log 120 python3 $A/torch_baseline_bench.py $c compile; done
  run refs.log 100 $B --config gpt-125m $NC --compile model --ce chunked-recompute \
    --label fast-compile-model-ce-recompute
}

c3_two() {  # TP = 2 + SP whole model compiled: NCCL protocol / channels, Inductor comm reorder
  unset CUDA_VISIBLE_DEVICES
  local M="--tp 2 --sp --compile model"
  NCCL_PROTO=Simple run tp.log 100 $T $L13 $M --label fast-tp2-sp-model-simple
  NCCL_PROTO=Simple NCCL_MIN_NCHANNELS=32 run tp.log 110 $T $L13 $M --label fast-tp2-sp-model-simple-32ch \
    --profile "$OUT/profile-tp2-model.json" --trace "$OUT/trace-tp2-model.json.gz"
  run tp.log 100 $T $L13 $M --comm-reorder --label fast-tp2-sp-model-comm-reorder
  run dp.log 80 $T $L13 --overlap-grad-reduce --bucket-size 100000000 \
    --compile-mode reduce-overhead --label fast-dp2-overlap-bucket100m-cudagraphs
}

c4_tests() {  # CUDA tests (incl. CUDA-graph layers under DDP), PP / CP bench layouts on 2 GPUs
  export CUDA_VISIBLE_DEVICES=0
  run_tests 170 tests/gpu
  unset CUDA_VISIBLE_DEVICES
  run_tests 120 -m gpu tests/dist/test_bench_gpt_layouts.py -k two_gpus
}

next_gpu0() {  # planned for the next session (not run yet): one-GPU references
  export CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29801
  run refs.log 120 $B $L13 --compile model --ce chunked-recompute --label fast-compile-model-ce-recompute
  run refs.log 80 $B $L13 --compile-mode reduce-overhead --label fast-layers-cudagraphs
}

next_two() {  # planned: TP = 2 + SP with the backward schedule kept (--no-memory-reorder)
  unset CUDA_VISIBLE_DEVICES
  local M="--tp 2 --sp --compile model --no-memory-reorder"
  export NCCL_PROTO=Simple NCCL_MIN_NCHANNELS=32
  run tp.log 110 $T $L13 $M --label fast-tp2-sp-model-keep-order \
    --profile "$OUT/profile-tp2-keep-order.json" --trace "$OUT/trace-tp2-keep-order.json.gz"
  run tp.log 110 $T $L13 $M --tp-comm-overlap --label fast-tp2-sp-model-keep-order-tp-overlap \
    --profile "$OUT/profile-tp2-keep-order-overlap.json"
  run tp.log 90 $T $L13 --tp 2 --sp --tp-comm-overlap --label fast-tp2-sp-layers-tp-overlap \
    --profile "$OUT/profile-tp2-layers-overlap.json"
  unset NCCL_PROTO NCCL_MIN_NCHANNELS
  run dp.log 80 $T $L13 --overlap-grad-reduce --bucket-size 100000000 \
    --compile-mode reduce-overhead --label fast-dp2-overlap-bucket100m-cudagraphs
  run_tests 300 -m gpu tests/dist/test_bench_gpt_layouts.py -k two_gpus
}

case "${1:-}" in
  call1)
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    c1_gpu0 &
    c1_gpu1 &
    wait
    c1_two
    ;;
  call2)
    c2_two
    ;;
  call3)
    c3_gpu0 &
    c3_gpu1 &
    wait
    c3_two
    ;;
  call4)
    c4_tests
    exit 0
    ;;
  next)
    next_gpu0
    next_two
    ;;
  two)  # call 1's two-GPU part again (its first try launched torchrun wrongly)
    c1_two
    ;;
  *)
    echo "usage: $0 call1|two|call2|call3|call4|next" >&2
    exit 2
    ;;
esac
python3 bench/compare.py "$RES" 2>/dev/null | tail -40
