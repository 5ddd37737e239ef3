#!/usr/bin/env bash
# Session 9 GPU measurements of issue 9 (bench/reports/2026-11-30-s9-gpu.md), device kind
# nvidia-h200-x2, from the repo root:
#
#   bash bench/run_gpu_2026-11-30-s9.sh targets  # call 1: every target of the issue in one
#       call beside its anchor: gpt-1.3b and gpt-125m on GPU 0 while the torch.compile anchor
#       runs the same config on GPU 1; then DP = 2 (flat-overlap) and TP = 2 + SP on both
#   bash bench/run_gpu_2026-11-30-s9.sh train    # call 2: pretrain_gpt (gpt-1.3b shape, no
#       dropout, clip 1.0) with the NaN/Inf check folded into the clipping norm: torch Adam step
#       on GPU 0 beside the flat step on GPU 1, then swapped; then both with the light profile
#   bash bench/run_gpu_2026-11-30-s9.sh diag     # call 3: where pretrain_gpt's idle time goes
#       (the --profile summary fixed: its iteration ranges hid every gap) beside the host syncs
#       counted by call site (bench/sync_debug_run.py); the flat step profiled; Megatron's
#       default dropout 0.1
#   bash bench/run_gpu_2026-11-30-s9.sh final    # call 4: the weight gradient accumulated in
#       fp32 by one GEMM (addmm.dtype_out): its GPU test; pretrain_gpt profiled (with what the
#       host runs in the largest GPU idle gaps) beside the sync-debug run; then the fp32-GEMM
#       wgrad (GPU 0) against the bf16 GEMM + fp32 add (GIGATRON_WGRAD_FP32_GEMM=0, GPU 1)
#   bash bench/run_gpu_2026-11-30-s9.sh last     # call 5: the flat step with the fp32-GEMM wgrad
#       (GPU 0) beside the sync-debug run with full stacks and dynamo's recompile / graph-break
#       logs (GPU 1): where the per-iteration sync inside the compiled forward comes from
#   bash bench/run_gpu_2026-11-30-s9.sh confirm  # call 6: torch step vs flat step, both GPUs,
#       swapped (after the chunked CE's recompile fix: the first window's time shows the compile)
#
# Results: one JSON object a line in $OUT/results.jsonl; logs in $OUT.
source bench/_run_lib.sh

T="torchrun --nproc-per-node 2 --master-port 29651 bench/bench_gpt.py"
BEST="$NC --gelu tanh --compile model --ce chunked"

targets() {
  (
    for c in gpt-1.3b gpt-125m; do
      CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29941 run refs.log 140 $B --config $c $BEST \
        --label fast-compile-model-tanh
    done
  ) &
  (
    for c in gpt-1.3b gpt-125m; do
      CUDA_VISIBLE_DEVICES=1 run anchors.log 140 python3 $A/torch_baseline_bench.py $c compile
    done
  ) &
  wait
  local D="--config gpt-1.3b $BEST --overlap-grad-reduce --bucket-size 100000000"
  run dp.log 140 $T $D --layers-per-graph 2,22 --optimizer flat-overlap \
    --label fast-dp2-model-groups2-22-tanh-flat-overlap
  run tp.log 130 $T --config gpt-1.3b $BEST --tp 2 --sp --no-memory-reorder \
    --label fast-tp2-sp-model-tanh
}

# TRAIN_SHAPE and train_one() are in bench/_run_lib.sh

train() {
  train_one 0 29921 230 nodrop --clip-grad 1.0 &
  GIGATRON_FLAT_OPTIMIZER_STEP=1 train_one 1 29931 230 nodrop-flat-step --clip-grad 1.0 &
  wait
  GIGATRON_FLAT_OPTIMIZER_STEP=1 train_one 0 29921 230 nodrop-flat-step --clip-grad 1.0 &
  train_one 1 29931 230 nodrop --clip-grad 1.0 &
  wait
  local prof="--profile --use-pytorch-profiler --profile-step-start 32 --profile-step-end 34"
  export GIGATRON_PROFILE_STACKS=0
  train_one 0 29921 200 nodrop-light-profile --clip-grad 1.0 $prof --tensorboard-dir /tmp/tb-a &
  GIGATRON_FLAT_OPTIMIZER_STEP=1 train_one 1 29931 200 nodrop-flat-step-light-profile \
    --clip-grad 1.0 $prof --tensorboard-dir /tmp/tb-b &
  wait
}

diag() {
  local prof="--profile --use-pytorch-profiler --profile-step-start 32 --profile-step-end 34"
  export GIGATRON_PROFILE_STACKS=0
  train_one 0 29921 220 nodrop-light-profile --clip-grad 1.0 $prof --tensorboard-dir /tmp/tb-a &
  ENTRY="bench/sync_debug_run.py -m gigatron.training.pretrain_gpt" \
    train_one 1 29931 220 nodrop-sync-debug --clip-grad 1.0 &
  wait
  GIGATRON_FLAT_OPTIMIZER_STEP=1 train_one 0 29921 200 nodrop-flat-step-light-profile \
    --clip-grad 1.0 $prof --tensorboard-dir /tmp/tb-b &
  train_one 1 29931 200 base-dropout --clip-grad 1.0 --hidden-dropout 0.1 --attention-dropout 0.1 &
  wait
}

final() {
  local prof="--profile --use-pytorch-profiler --profile-step-start 32 --profile-step-end 34"
  GIGATRON_PROFILE_STACKS=0 train_one 0 29921 230 nodrop-wgrad32-light-profile --clip-grad 1.0 \
    $prof --tensorboard-dir /tmp/tb-a &
  (
    CUDA_VISIBLE_DEVICES=1 run_tests 60 tests/gpu/test_wgrad_fp32_accumulate.py
    ENTRY="bench/sync_debug_run.py -m gigatron.training.pretrain_gpt" \
      train_one 1 29931 200 nodrop-wgrad32-sync-debug --clip-grad 1.0
  ) &
  wait
  train_one 0 29921 200 nodrop-wgrad32 --clip-grad 1.0 &
  GIGATRON_WGRAD_FP32_GEMM=0 train_one 1 29931 200 nodrop-wgrad-bf16-add --clip-grad 1.0 &
  wait
}

last() {
  GIGATRON_FLAT_OPTIMIZER_STEP=1 train_one 0 29921 220 nodrop-wgrad32-flat-step --clip-grad 1.0 &
  TORCH_LOGS=recompiles,graph_breaks ENTRY="bench/sync_debug_run.py -m gigatron.training.pretrain_gpt" \
    train_one 1 29931 220 nodrop-wgrad32-sync-stacks --clip-grad 1.0 &
  wait
  grep -h "Recompil\|Graph break\|graph break" "$OUT"/train-nodrop-wgrad32-sync-stacks-gpu1.log \
    | head -40 >>"$OUT/syncs.txt"
}

confirm() {
  train_one 0 29921 150 nodrop-wgrad32 --clip-grad 1.0 &
  GIGATRON_FLAT_OPTIMIZER_STEP=1 train_one 1 29931 150 nodrop-wgrad32-flat-step --clip-grad 1.0 &
  wait
  GIGATRON_FLAT_OPTIMIZER_STEP=1 train_one 0 29921 150 nodrop-wgrad32-flat-step --clip-grad 1.0 &
  train_one 1 29931 150 nodrop-wgrad32 --clip-grad 1.0 &
  wait
}

case "${1:-}" in
  confirm) confirm ;;
  last) last ;;
  final) final ;;
  targets) targets ;;
  train) train ;;
  diag) diag ;;
  *) echo "usage: $0 targets|train|diag|final|last|confirm" >&2; exit 2 ;;
esac
python3 bench/compare.py "$RES" 2>/dev/null | tail -40
