#!/usr/bin/env bash
# Session 8 GPU measurements of issue 9 (bench/reports/2026-11-30-s8-gpu.md), device kind
# nvidia-h200-x2, from the repo root:
#
#   bash bench/run_gpu_2026-11-30-s7.sh train   # call 1: pretrain_gpt's first GPU figures (400
#       TFLOP/s against the bench's ~575), bench_adamw with the training optimizers
#   bash bench/run_gpu_2026-11-30-s8.sh diag    # call 2: where pretrain_gpt's time goes: its own
#       --profile summary with Megatron's default dropout (0.1) and without; without clipping;
#       with the flat Adam step; the one-GPU bench for the DP ratio; DP = 2 with
#       FlatAdamW.finish_grad_sync_and_step (flat-overlap) and with plain FlatAdamW
#   bash bench/run_gpu_2026-11-30-s8.sh train2  # call 3: after the training-loop fixes (one
#       host sync for the NaN check instead of one per param, losses read at log time, no
#       exit-condition all-reduce, clipping folded into the flat step): GPU tests; bench_adamw
#       gpt-1.3b; pretrain_gpt without dropout with and without the flat step (profiled, then
#       swapped), with Megatron's default dropout (profiled), without clipping
#   bash bench/run_gpu_2026-11-30-s8.sh train3  # call 4: pretrain_gpt without dropout, clip 1.0,
#       with and without the flat Adam step on both GPUs, swapped; then both with the light
#       profile (GIGATRON_PROFILE_STACKS=0: the GPU idle time without the profiler's overhead)
#   bash bench/run_gpu_2026-11-30-s8.sh confirm-train  # NOT RUN (next session): pretrain_gpt
#       after the host-work cuts committed after call 4: no dropout, torch step (GPU 0) beside
#       the flat step (GPU 1), then swapped, each run given 230 s (cold whole-model compiles)
#   bash bench/run_gpu_2026-11-30-s8.sh confirm-dp     # NOT RUN (next session): the one-GPU
#       benchmark step and DP = 2 with flat-overlap / flat, to confirm 1.9x in a second call
#
# Results: one JSON object a line in $OUT/results.jsonl; logs in $OUT.
source bench/_run_lib.sh

T="torchrun --nproc-per-node 2 --master-port 29651 bench/bench_gpt.py"

# pretrain_gpt at gpt-1.3b's shape (TRAIN_SHAPE overrides it for a CPU dry run); iterations
# 32-33 profiled (window 31-40), the last logged window (41-50) is clean
TRAIN_SHAPE=${TRAIN_SHAPE:-"--num-layers 24 --hidden-size 2048 --num-attention-heads 16 \
  --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 4 --global-batch-size 4 \
  --vocab-size 50304 --train-iters 50 --log-interval 10"}

train_one() {  # train_one GPU PORT LIMIT LABEL FLAGS...: pretrain_gpt on one GPU
  local gpu=$1 port=$2 lim=$3 label=$4
  shift 4
  local log="$OUT/train-$label-gpu$gpu.log"
  local left=$((END - $(date +%s)))
  [ "$lim" -gt "$left" ] && lim=$left
  if [ "$lim" -lt 25 ]; then echo "{\"skipped\": \"train $label\"}" >>"$RES"; return; fi
  echo "=== train $label GPU $gpu $* ($(date -u +%T))" >>"$OUT/train.log"
  # shellcheck disable=SC2086  (TRAIN_SHAPE is a list of flags)
  CUDA_VISIBLE_DEVICES=$gpu timeout "$lim" \
    torchrun --nproc-per-node 1 --master-port "$port" -m gigatron.training.pretrain_gpt \
    $TRAIN_SHAPE --lr 1e-4 --min-lr 1e-5 --mock-data --bf16 --use-distributed-optimizer \
    --accumulate-allreduce-grads-in-fp32 --cross-entropy-loss-fusion --torch-compile model \
    --weight-decay 0.1 --eval-iters 0 --eval-interval 100000 --no-progress-bar "$@" >"$log" 2>&1
  grep -v "^W1\|warn" "$log" | tail -c 4000 >>"$OUT/train.log"
  { echo "=== $label GPU $gpu $*"; grep -A24 "^profile: " "$log"; } >>"$OUT/profiles.txt"
  local line
  line=$(python3 bench/parse_train_log.py "$log" --label "$label" | sed -n 's/^RESULT //p')
  if [ -n "$line" ]; then echo "$line" >>"$RES"; else
    echo "{\"failed\": \"train $label\", \"rc\": 1}" >>"$RES"; fi
}

PROF="--profile --use-pytorch-profiler --profile-step-start 32 --profile-step-end 34"
NODROP="--hidden-dropout 0 --attention-dropout 0"

diag() {
  train_one 0 29921 120 base --clip-grad 1.0 $PROF --tensorboard-dir /tmp/tb-base &
  train_one 1 29931 120 nodrop --clip-grad 1.0 $NODROP $PROF --tensorboard-dir /tmp/tb-nodrop &
  wait
  CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29941 run refs.log 130 $B --config gpt-1.3b $NC \
    --gelu tanh --compile model --ce chunked --label fast-compile-model-tanh &
  (
    train_one 1 29931 70 nodrop-noclip --clip-grad 0 $NODROP
    GIGATRON_FLAT_OPTIMIZER_STEP=1 train_one 1 29931 70 nodrop-flat-step --clip-grad 1.0 $NODROP
  ) &
  wait
  local D="--config gpt-1.3b $NC --gelu tanh --ce chunked --compile model --overlap-grad-reduce"
  D="$D --bucket-size 100000000 --layers-per-graph 2,22"
  run dp.log 120 $T $D --optimizer flat-overlap --label fast-dp2-model-groups2-22-tanh-flat-overlap
  run dp.log 110 $T $D --optimizer flat --label fast-dp2-model-groups2-22-tanh-flat-adamw
}

train2() {
  CUDA_VISIBLE_DEVICES=0 run_tests 100 tests/gpu/test_flat_adam_step_cuda.py \
    tests/gpu/test_multi_tensor_adamw_streams.py tests/dist/test_flat_adamw.py -m gpu &
  CUDA_VISIBLE_DEVICES=1 run adamw.log 100 python3 bench/bench_adamw.py --config gpt-1.3b &
  wait
  train_one 0 29921 150 nodrop --clip-grad 1.0 $NODROP $PROF --tensorboard-dir /tmp/tb-a &
  GIGATRON_FLAT_OPTIMIZER_STEP=1 train_one 1 29931 150 nodrop-flat-step --clip-grad 1.0 \
    $NODROP $PROF --tensorboard-dir /tmp/tb-b &
  wait
  train_one 0 29921 130 base --clip-grad 1.0 $PROF --tensorboard-dir /tmp/tb-c &
  train_one 1 29931 130 nodrop-noclip --clip-grad 0 $NODROP &
  wait
  GIGATRON_FLAT_OPTIMIZER_STEP=1 train_one 0 29921 120 nodrop-flat-step --clip-grad 1.0 \
    $NODROP &
  train_one 1 29931 120 nodrop --clip-grad 1.0 $NODROP &
  wait
}

train3() {
  train_one 0 29921 110 nodrop --clip-grad 1.0 $NODROP &
  GIGATRON_FLAT_OPTIMIZER_STEP=1 train_one 1 29931 110 nodrop-flat-step --clip-grad 1.0 \
    $NODROP &
  wait
  GIGATRON_FLAT_OPTIMIZER_STEP=1 train_one 0 29921 100 nodrop-flat-step --clip-grad 1.0 \
    $NODROP &
  train_one 1 29931 100 nodrop --clip-grad 1.0 $NODROP &
  wait
  export GIGATRON_PROFILE_STACKS=0
  train_one 0 29921 110 nodrop-light-profile --clip-grad 1.0 $NODROP $PROF \
    --tensorboard-dir /tmp/tb-d &
  GIGATRON_FLAT_OPTIMIZER_STEP=1 train_one 1 29931 110 nodrop-flat-step-light-profile \
    --clip-grad 1.0 $NODROP $PROF --tensorboard-dir /tmp/tb-e &
  wait
}

confirm_train() {
  train_one 0 29921 230 nodrop --clip-grad 1.0 $NODROP &
  GIGATRON_FLAT_OPTIMIZER_STEP=1 train_one 1 29931 230 nodrop-flat-step --clip-grad 1.0 \
    $NODROP &
  wait
  GIGATRON_FLAT_OPTIMIZER_STEP=1 train_one 0 29921 230 nodrop-flat-step --clip-grad 1.0 \
    $NODROP &
  train_one 1 29931 230 nodrop --clip-grad 1.0 $NODROP &
  wait
}

confirm_dp() {
  CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29941 run refs.log 150 $B --config gpt-1.3b $NC \
    --gelu tanh --compile model --ce chunked --label fast-compile-model-tanh
  local D="--config gpt-1.3b $NC --gelu tanh --ce chunked --compile model --overlap-grad-reduce"
  D="$D --bucket-size 100000000 --layers-per-graph 2,22"
  run dp.log 150 $T $D --optimizer flat-overlap --label fast-dp2-model-groups2-22-tanh-flat-overlap
  run dp.log 140 $T $D --optimizer flat --label fast-dp2-model-groups2-22-tanh-flat-adamw
}

case "${1:-}" in
  confirm-train) confirm_train ;;
  confirm-dp) confirm_dp ;;
  diag) diag ;;
  train3) train3 ;;
  train2) train2 ;;
  dry) train_one 0 29921 120 base --clip-grad 1.0 $PROF --tensorboard-dir /tmp/tb-base ;;
  *) echo "usage: $0 diag|train2|train3|confirm-train|confirm-dp|dry" >&2; exit 2 ;;
esac
python3 bench/compare.py "$RES" 2>/dev/null | tail -40
