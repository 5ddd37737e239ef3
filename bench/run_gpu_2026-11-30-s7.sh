#!/usr/bin/env bash
# Session 7 GPU measurements of issue 9 (bench/reports/2026-11-30-s7-gpu.md), device kind
# nvidia-h200-x2, from the repo root:
#
#   bash bench/run_gpu_2026-11-30-s6.sh mt       # call 1 (session 6's script, run first here)
#   bash bench/run_gpu_2026-11-30-s7.sh gapdp    # call 2: FlatAdamW's GPU test; why every GEMM
#       class runs 4-6% longer in gigatron's step than in the anchor's (GPU 0 gpt-1.3b, GPU 1
#       gpt-125m, concurrently: the layer GEMMs in isolation with both init distributions,
#       gigatron with Megatron's and with the anchor's init, the anchor; gpt-125m kernel profiles
#       of gigatron and its anchor; SM clock / power sampled by nvidia-smi into smi.csv); then
#       DP = 2 gpt-1.3b with FlatAdamW and with torch fused AdamW (layer groups 2,22)
#   bash bench/run_gpu_2026-11-30-s6.sh nccl     # call 3: NCCL settings for TP = 2 + SP
#   bash bench/run_gpu_2026-11-30-s7.sh last     # call 4: MultiTensorAdamW with its host work
#       per group and cached address arrays: GPU tests, bench_adamw.py on both configs; gpt-1.3b
#       one GPU torch fused AdamW (GPU 0) beside MultiTensorAdamW (GPU 1); DP = 2 with FlatAdamW
#       and with MultiTensorAdamW (layer groups 2,22)
#   bash bench/run_gpu_2026-11-30-s7.sh train    # NOT RUN YET (next session): GPU tests of the
#       flat Adam step and the optimizers; bench_adamw.py on both configs (incl. gigatron's
#       training optimizer: Float16, distributed, distributed + flat step); pretrain_gpt itself
#       (Megatron's flags, gpt-1.3b shape, mock data, bf16, distributed optimizer, fp32 grads,
#       CE fusion, whole model compiled) with and without GIGATRON_FLAT_OPTIMIZER_STEP=1 on both
#       GPUs at once, then swapped: the first GPU measurement of the training loop itself
#
# Results: one JSON object a line in $OUT/results.jsonl; logs in $OUT.
source bench/_run_lib.sh

T="torchrun --nproc-per-node 2 --master-port 29651 bench/bench_gpt.py"

one() {  # one CONFIG GPU PORT LIMIT LABEL FLAGS...: the anchor's model (tanh GELU), compiled
  local config=$1 gpu=$2 port=$3 lim=$4 label=$5
  shift 5
  CUDA_VISIBLE_DEVICES=$gpu MASTER_PORT=$port run refs.log "$lim" $B --config "$config" $NC \
    --gelu tanh --compile model --ce chunked --label "$label" "$@"
}

gap_gpu() {  # gap_gpu GPU CONFIG PORT: isolated GEMMs, both inits, the anchor (+ profiles)
  local gpu=$1 config=$2 port=$3
  CUDA_VISIBLE_DEVICES=$gpu run gemm.log 60 python3 bench/bench_gemm_shapes.py --config "$config"
  one "$config" "$gpu" "$port" 120 fast-compile-model-tanh
  one "$config" "$gpu" "$port" 80 fast-compile-model-tanh-anchor-init --anchor-init
  CUDA_VISIBLE_DEVICES=$gpu run anchors.log 90 python3 $A/torch_baseline_bench.py "$config" compile
  if [ "$config" = gpt-125m ]; then
    one "$config" "$gpu" "$port" 70 fast-compile-model-tanh-profiled \
      --profile "$OUT/profile-gigatron-gpt-125m.json"
    CUDA_VISIBLE_DEVICES=$gpu run anchors.log 70 python3 bench/compare_profile.py gpt-125m compile \
      "$OUT/profile-torch-compile-gpt-125m.json"
  fi
}

gapdp() {
  run_tests 90 tests/dist/test_flat_adamw.py -m gpu
  nvidia-smi --query-gpu=index,timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
    --format=csv,noheader -lms 250 >"$OUT/smi.csv" &
  local smi=$!
  gap_gpu 0 gpt-1.3b 29921 &
  local g0=$!
  gap_gpu 1 gpt-125m 29931 &
  local g1=$!
  wait "$g0" "$g1"
  kill "$smi"
  unset CUDA_VISIBLE_DEVICES
  local D="--config gpt-1.3b $NC --gelu tanh --ce chunked --compile model --overlap-grad-reduce"
  D="$D --bucket-size 100000000 --layers-per-graph 2,22"
  run dp.log 120 $T $D --optimizer flat --label fast-dp2-model-groups2-22-tanh-flat-adamw
  run dp.log 90 $T $D --label fast-dp2-model-groups2-22-tanh
}

last() {
  run_tests 90 tests/unit/test_multi_tensor_adamw.py tests/dist/test_flat_adamw.py -m gpu
  CUDA_VISIBLE_DEVICES=0 run adamw.log 60 python3 bench/bench_adamw.py --config gpt-1.3b &
  CUDA_VISIBLE_DEVICES=1 run adamw.log 60 python3 bench/bench_adamw.py --config gpt-125m &
  wait
  one gpt-1.3b 0 29921 120 fast-compile-model-tanh &
  one gpt-1.3b 1 29931 120 fast-compile-model-tanh-mt-adamw --optimizer multi-tensor &
  wait
  unset CUDA_VISIBLE_DEVICES
  local D="--config gpt-1.3b $NC --gelu tanh --ce chunked --compile model --overlap-grad-reduce"
  D="$D --bucket-size 100000000 --layers-per-graph 2,22"
  run dp.log 110 $T $D --optimizer flat --label fast-dp2-model-groups2-22-tanh-flat-adamw
  run dp.log 90 $T $D --optimizer multi-tensor --label fast-dp2-model-groups2-22-tanh-mt-adamw
}

# pretrain_gpt at gpt-1.3b's shape (TRAIN_SHAPE overrides it for a CPU dry run)
TRAIN_SHAPE=${TRAIN_SHAPE:-"--num-layers 24 --hidden-size 2048 --num-attention-heads 16 \
  --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 4 --global-batch-size 4 \
  --vocab-size 50304 --train-iters 40 --log-interval 10"}

train_one() {  # train_one GPU PORT LIMIT LABEL FLAT(0|1): pretrain_gpt on one GPU
  local gpu=$1 port=$2 lim=$3 label=$4 flat=$5
  local log="$OUT/train-$label-gpu$gpu.log"
  local left=$((END - $(date +%s)))
  [ "$lim" -gt "$left" ] && lim=$left
  if [ "$lim" -lt 25 ]; then echo "{\"skipped\": \"train $label\"}" >>"$RES"; return; fi
  echo "=== train $label GPU $gpu flat=$flat ($(date -u +%T))" >>"$OUT/train.log"
  # shellcheck disable=SC2086  (TRAIN_SHAPE is a list of flags)
  CUDA_VISIBLE_DEVICES=$gpu GIGATRON_FLAT_OPTIMIZER_STEP=$flat timeout "$lim" \
    torchrun --nproc-per-node 1 --master-port "$port" -m gigatron.training.pretrain_gpt \
    $TRAIN_SHAPE --lr 1e-4 --min-lr 1e-5 --mock-data --bf16 --use-distributed-optimizer \
    --accumulate-allreduce-grads-in-fp32 --cross-entropy-loss-fusion --torch-compile model \
    --clip-grad 1.0 --weight-decay 0.1 --eval-iters 0 --eval-interval 100000 \
    --no-progress-bar >"$log" 2>&1
  tail -c 3000 "$log" >>"$OUT/train.log"
  local line
  line=$(python3 bench/parse_train_log.py "$log" --label "$label" | sed -n 's/^RESULT //p')
  if [ -n "$line" ]; then echo "$line" >>"$RES"; else
    echo "{\"failed\": \"train $label\", \"rc\": 1}" >>"$RES"; fi
}

train() {
  run_tests 150 tests/gpu/test_flat_adam_step_cuda.py tests/unit/test_multi_tensor_adamw.py \
    tests/dist/test_flat_adamw.py -m gpu
  CUDA_VISIBLE_DEVICES=0 run adamw.log 150 python3 bench/bench_adamw.py --config gpt-1.3b &
  CUDA_VISIBLE_DEVICES=1 run adamw.log 120 python3 bench/bench_adamw.py --config gpt-125m &
  wait
  train_one 0 29921 150 torch-adamw 0 &
  train_one 1 29931 150 flat-step 1 &
  wait
  train_one 0 29921 110 flat-step 1 &
  train_one 1 29931 110 torch-adamw 0 &
  wait
}

case "${1:-}" in
  gapdp) gapdp ;;
  last) last ;;
  train) train ;;
  *) echo "usage: $0 gapdp|last|train" >&2; exit 2 ;;
esac
python3 bench/compare.py "$RES" 2>/dev/null | tail -40
