#!/usr/bin/env bash
# Session 4 GPU measurements of issue 9 (bench/reports/2026-11-30-s4-gpu.md), device kind
# nvidia-h200-x2, from the repo root:
#
#   bash bench/run_gpu_2026-11-30-s4.sh tp     # one-GPU reference, then TP = 2 + SP whole-model
#       compiled with the backward schedule kept (--no-memory-reorder) +- --tp-comm-overlap
#       (all-gather and reduce-scatter pipelined), layers compiled with --tp-comm-overlap
#   bash bench/run_gpu_2026-11-30-s4.sh tp2    # call 1's whole-model runs with longer limits;
#       --tp-comm-overlap with cuBLAS leaving 16 SMs to NCCL (--sm-carveout 16)
#   bash bench/run_gpu_2026-11-30-s4.sh cdmc   # --tp-comm-overlap with CUDA_DEVICE_MAX_CONNECTIONS=1
#       (+- --sm-carveout 16); DP = 2 with CUDA graphs and its one-GPU reference
#   bash bench/run_gpu_2026-11-30-s4.sh layouts  # PP / VPP / CP bench layouts test on two GPUs
#   bash bench/run_gpu_2026-11-30-s4.sh last   # GPU 0: whole-model max-autotune; GPU 1: both
#       configs with the plain-PyTorch anchor beside them, megatron-core anchor
#   bash bench/run_gpu_2026-11-30-s4.sh next   # NOT RUN YET: DP = 2 with --grad-acc-fusion
#       (+- CUDA graphs), one-GPU references through GPTModel's fused cross entropy
#   bash bench/run_gpu_2026-11-30-s4.sh dp     # DP = 2 (CUDA graphs, 100M buckets) and its
#       one-GPU reference, PP / CP bench layouts test on two GPUs
#
# Results: one JSON object a line in $OUT/results.jsonl; logs, profiles, traces in $OUT.
source bench/_run_lib.sh

T="torchrun --nproc-per-node 2 --master-port 29651 bench/bench_gpt.py"
L13="--config gpt-1.3b $NC"

tp_calls() {
  export CUDA_VISIBLE_DEVICES=0
  run refs.log 110 $B $L13 --compile model --ce chunked-recompute --label fast-compile-model-ce-recompute
  unset CUDA_VISIBLE_DEVICES
  local M="--tp 2 --sp --compile model --no-memory-reorder"
  export NCCL_PROTO=Simple NCCL_MIN_NCHANNELS=32
  run tp.log 110 $T $L13 $M --tp-comm-overlap --label fast-tp2-sp-model-keep-order-tp-overlap \
    --profile "$OUT/profile-tp2-keep-order-overlap.json" --trace "$OUT/trace-tp2-keep-order-overlap.json.gz"
  run tp.log 100 $T $L13 $M --label fast-tp2-sp-model-keep-order \
    --profile "$OUT/profile-tp2-keep-order.json"
  run tp.log 90 $T $L13 --tp 2 --sp --tp-comm-overlap --label fast-tp2-sp-layers-tp-overlap \
    --profile "$OUT/profile-tp2-layers-overlap.json"
  unset NCCL_PROTO NCCL_MIN_NCHANNELS
}

tp2_calls() {  # the whole-model runs of call 1 ran out of their limits: longer ones, SM carveout
  unset CUDA_VISIBLE_DEVICES
  local M="--tp 2 --sp --compile model --no-memory-reorder"
  export NCCL_PROTO=Simple NCCL_MIN_NCHANNELS=32
  run tp.log 200 $T $L13 $M --label fast-tp2-sp-model-keep-order \
    --profile "$OUT/profile-tp2-keep-order.json"
  unset NCCL_MIN_NCHANNELS
  run tp.log 240 $T $L13 $M --tp-comm-overlap --sm-carveout 16 \
    --label fast-tp2-sp-model-keep-order-tp-overlap-carveout16 \
    --profile "$OUT/profile-tp2-keep-order-overlap.json" --trace "$OUT/trace-tp2-keep-order-overlap.json.gz"
  unset NCCL_PROTO
}

cdmc_calls() {  # call 2: overlapped all-gathers ran ~3x slower; one hardware queue keeps each
  # NCCL kernel ahead of the GEMM launched after it (what Megatron asks for its TP overlap)
  unset CUDA_VISIBLE_DEVICES
  local M="--tp 2 --sp --compile model --no-memory-reorder --tp-comm-overlap"
  export NCCL_PROTO=Simple CUDA_DEVICE_MAX_CONNECTIONS=1
  run tp.log 130 $T $L13 $M --label fast-tp2-sp-model-tp-overlap-cdmc1 \
    --profile "$OUT/profile-tp2-overlap-cdmc1.json" --trace "$OUT/trace-tp2-overlap-cdmc1.json.gz"
  run tp.log 130 $T $L13 $M --sm-carveout 16 --label fast-tp2-sp-model-tp-overlap-cdmc1-carveout16 \
    --profile "$OUT/profile-tp2-overlap-cdmc1-carveout16.json"
  unset NCCL_PROTO CUDA_DEVICE_MAX_CONNECTIONS
  export CUDA_VISIBLE_DEVICES=0
  run refs.log 80 $B $L13 --compile-mode reduce-overhead --label fast-layers-cudagraphs
  unset CUDA_VISIBLE_DEVICES
  run dp.log 80 $T $L13 --overlap-grad-reduce --bucket-size 100000000 \
    --compile-mode reduce-overhead --label fast-dp2-overlap-bucket100m-cudagraphs
}

layouts_test() {
  unset CUDA_VISIBLE_DEVICES
  run_tests 420 -m gpu tests/dist/test_bench_gpt_layouts.py -k two_gpus
}

last_gpu0() {  # whole-model compile with max-autotune (ran out of 290 s in session 3)
  export CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29901
  run autotune.log 500 $B $L13 --compile model --ce chunked-recompute \
    --compile-mode max-autotune-no-cudagraphs --label fast-model-max-autotune
}

last_gpu1() {  # one-GPU standing with both anchors re-measured beside it
  export CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29911
  for c in gpt-1.3b gpt-125m; do
    run refs.log 120 $B --config $c $NC --compile model --ce chunked-recompute \
      --label fast-compile-model-ce-recompute
    run anchors.log 120 python3 $A/torch_baseline_bench.py $c compile
  done
  run anchors.log 100 torchrun --nproc-per-node 1 --master-port 29911 $A/megatron_core_bench.py gpt-1.3b
}

next_gpu0() {  # NOT RUN YET: one-GPU references through GPTModel's fused cross entropy
  export CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29921
  run refs.log 120 $B $L13 --compile model --ce chunked --label fast-compile-model-gptmodel-ce
  run refs.log 80 $B $L13 --compile-mode reduce-overhead --label fast-layers-cudagraphs
  run_tests 100 tests/gpu/test_fast_path.py -k wgrad
}

next_gpu1() {  # NOT RUN YET: kernel profiles of the best one-GPU step and of the compiled anchor
  export CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29931
  run refs.log 150 $B $L13 --compile model --label fast-compile-model-profiled \
    --profile "$OUT/profile-1gpu-model.json" --trace "$OUT/trace-1gpu-model.json.gz"
  run anchors.log 120 python3 bench/compare_profile.py gpt-1.3b compile "$OUT/profile-torch-compile.json"
}

next_two() {  # NOT RUN YET: DP = 2 with gradient_accumulation_fusion (dW added into DDP's
  # main_grad by addmm_: no grad copy in DDP's hook), with and without per-layer CUDA graphs (the
  # in-place main_grad update may keep cudagraph trees off), and the same without fusion
  unset CUDA_VISIBLE_DEVICES
  local D="--overlap-grad-reduce --bucket-size 100000000"
  run dp.log 80 $T $L13 $D --grad-acc-fusion --label fast-dp2-overlap-bucket100m-gaf
  run dp.log 80 $T $L13 $D --grad-acc-fusion --compile-mode reduce-overhead \
    --label fast-dp2-overlap-bucket100m-gaf-cudagraphs
  run dp.log 80 $T $L13 $D --compile-mode reduce-overhead --label fast-dp2-overlap-bucket100m-cudagraphs
}

dp_calls() {
  export CUDA_VISIBLE_DEVICES=0
  run refs.log 80 $B $L13 --compile-mode reduce-overhead --label fast-layers-cudagraphs
  unset CUDA_VISIBLE_DEVICES
  run dp.log 80 $T $L13 --overlap-grad-reduce --bucket-size 100000000 \
    --compile-mode reduce-overhead --label fast-dp2-overlap-bucket100m-cudagraphs
  run_tests 300 -m gpu tests/dist/test_bench_gpt_layouts.py -k two_gpus
}

case "${1:-}" in
  tp) nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; tp_calls ;;
  tp2) tp2_calls ;;
  cdmc) cdmc_calls ;;
  layouts) layouts_test; exit 0 ;;
  last) last_gpu0 & last_gpu1 & wait ;;
  next) next_gpu0 & next_gpu1 & wait; next_two ;;
  dp) dp_calls ;;
  *) echo "usage: $0 tp|tp2|cdmc|layouts|last|next|dp" >&2; exit 2 ;;
esac
python3 bench/compare.py "$RES" 2>/dev/null | tail -40
