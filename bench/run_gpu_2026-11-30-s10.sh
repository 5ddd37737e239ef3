#!/usr/bin/env bash
# Session 10 GPU measurements of issue 9 (bench/reports/2026-11-30-s10-gpu.md), device kind
# nvidia-h200-x2, from the repo root:
#
#   bash bench/run_gpu_2026-11-30-s10.sh syncfree  # call 1: pretrain_gpt (gpt-1.3b shape, no
#       dropout, clip 1.0) with the sync-free step (GIGATRON_SYNC_FREE_STEP=1) on GPU 0 beside
#       the torch Adam step on GPU 1, then swapped; then the sync-free step profiled beside its
#       CUDA tests (no host sync in the step; fused-Adam skip)
#   bash bench/run_gpu_2026-11-30-s10.sh flat      # call 2: the sync-free step with the flat
#       Adam step (GIGATRON_FLAT_OPTIMIZER_STEP=1 GIGATRON_SYNC_FREE_STEP=1) on GPU 0 beside the
#       flat step alone on GPU 1, then swapped; profiled beside its CUDA tests and the host syncs
#       counted by call site (bench/sync_debug_run.py); Megatron's default dropout 0.1 with it
#       (GPU 0) beside the torch Adam step (GPU 1)
#   bash bench/run_gpu_2026-11-30-s10.sh default   # call 3: the flat Adam step now the default on
#       CUDA: pretrain_gpt as is (GPU 0) beside GIGATRON_FLAT_OPTIMIZER_STEP=0 (torch's fused
#       Adam, GPU 1), then swapped; every CUDA test (tests/gpu: the resume test, the default,
#       the sync-free step) beside Megatron's default dropout 0.1; then pretrain_gpt on DP = 2
#       (global batch 8, --overlap-grad-reduce --overlap-param-gather)
#   bash bench/run_gpu_2026-11-30-s10.sh compat    # call 4: the CPU test suite (tests/unit, tests/dist)
#       under the image's torch 2.11 with CUDA hidden (pytest-xdist, 14 workers) beside
#       pretrain_gpt on DP = 2 (the distributed optimizer's collectives fixed for torch 2.11);
#       then every CUDA test (GPU 0) beside the CUDA resume test (GPU 1)
#
# Results: one JSON object a line in $OUT/results.jsonl; logs in $OUT.
source bench/_run_lib.sh

syncfree() {
  GIGATRON_SYNC_FREE_STEP=1 train_one 0 29921 150 nodrop-sync-free --clip-grad 1.0 &
  train_one 1 29931 150 nodrop-torch-step --clip-grad 1.0 &
  wait
  train_one 0 29921 150 nodrop-torch-step --clip-grad 1.0 &
  GIGATRON_SYNC_FREE_STEP=1 train_one 1 29931 150 nodrop-sync-free --clip-grad 1.0 &
  wait
  local prof="--profile --use-pytorch-profiler --profile-step-start 32 --profile-step-end 34"
  GIGATRON_PROFILE_STACKS=0 GIGATRON_SYNC_FREE_STEP=1 train_one 0 29921 170 \
    nodrop-sync-free-light-profile --clip-grad 1.0 $prof --tensorboard-dir /tmp/tb-a &
  (CUDA_VISIBLE_DEVICES=1 run_tests 150 tests/gpu/test_optimizer_cuda.py) &
  wait
}

flat() {
  export GIGATRON_FLAT_OPTIMIZER_STEP=1
  GIGATRON_SYNC_FREE_STEP=1 train_one 0 29921 150 nodrop-flat-sync-free --clip-grad 1.0 &
  train_one 1 29931 150 nodrop-flat-step --clip-grad 1.0 &
  wait
  train_one 0 29921 150 nodrop-flat-step --clip-grad 1.0 &
  GIGATRON_SYNC_FREE_STEP=1 train_one 1 29931 150 nodrop-flat-sync-free --clip-grad 1.0 &
  wait
  local prof="--profile --use-pytorch-profiler --profile-step-start 32 --profile-step-end 34"
  GIGATRON_PROFILE_STACKS=0 GIGATRON_SYNC_FREE_STEP=1 train_one 0 29921 170 \
    nodrop-flat-sync-free-light-profile --clip-grad 1.0 $prof --tensorboard-dir /tmp/tb-a &
  (
    CUDA_VISIBLE_DEVICES=1 run_tests 150 tests/gpu/test_optimizer_cuda.py \
      tests/gpu/test_flat_adam_step_cuda.py
    GIGATRON_SYNC_FREE_STEP=1 ENTRY="bench/sync_debug_run.py -m gigatron.training.pretrain_gpt" \
      train_one 1 29931 170 nodrop-flat-sync-free-sync-debug --clip-grad 1.0
  ) &
  wait
  local drop="--hidden-dropout 0.1 --attention-dropout 0.1"
  GIGATRON_SYNC_FREE_STEP=1 train_one 0 29921 150 dropout-flat-sync-free --clip-grad 1.0 $drop &
  GIGATRON_FLAT_OPTIMIZER_STEP=0 train_one 1 29931 150 dropout-torch-step --clip-grad 1.0 $drop &
  wait
}

default() {
  train_one 0 29921 150 default-nodrop --clip-grad 1.0 &
  GIGATRON_FLAT_OPTIMIZER_STEP=0 train_one 1 29931 150 torch-step-nodrop --clip-grad 1.0 &
  wait
  GIGATRON_FLAT_OPTIMIZER_STEP=0 train_one 0 29921 150 torch-step-nodrop --clip-grad 1.0 &
  train_one 1 29931 150 default-nodrop --clip-grad 1.0 &
  wait
  (CUDA_VISIBLE_DEVICES=1 run_tests 240 tests/gpu) &
  train_one 0 29921 150 default-dropout --clip-grad 1.0 --hidden-dropout 0.1 \
    --attention-dropout 0.1 &
  wait
  NPROC=2 train_one 0,1 29921 170 default-nodrop-dp2 --clip-grad 1.0 --global-batch-size 8 \
    --overlap-grad-reduce --overlap-param-gather
}

compat() {
  (
    CUDA_VISIBLE_DEVICES="" timeout 420 python3 -m pytest tests/unit tests/dist -n 14 -q \
      -p no:cacheprovider --timeout 300 -o addopts="" -rf >"$OUT/cpu-tests-torch211.log" 2>&1
    tail -25 "$OUT/cpu-tests-torch211.log"
  ) &
  NPROC=2 train_one 0,1 29921 150 default-nodrop-dp2 --clip-grad 1.0 --global-batch-size 8 \
    --overlap-grad-reduce --overlap-param-gather
  (CUDA_VISIBLE_DEVICES=0 run_tests 200 tests/gpu -rf -k "not resume" --timeout 150) &
  (
    CUDA_VISIBLE_DEVICES=1 timeout 200 python3 -m pytest tests/gpu/test_training_resume_cuda.py \
      -q -p no:cacheprovider -rf >"$OUT/gpu-resume-test.log" 2>&1
    tail -5 "$OUT/gpu-resume-test.log"
  ) &
  wait
}

case "${1:-}" in
  compat) compat ;;
  default) default ;;
  syncfree) syncfree ;;
  flat) flat ;;
  *) echo "usage: $0 syncfree|flat|default|compat" >&2; exit 2 ;;
esac
python3 bench/compare.py "$RES" 2>/dev/null | tail -40
