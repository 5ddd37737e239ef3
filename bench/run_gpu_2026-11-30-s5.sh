#!/usr/bin/env bash
# Session 5 GPU measurements of issue 9 (bench/reports/2026-11-30-s5-gpu.md), device kind
# nvidia-h200-x2, from the repo root:
#
#   bash bench/run_gpu_2026-11-30-s5.sh ce     # copy-engine TP collectives: bitwise check vs
#       NCCL (eager, compiled), then a GEMM with each collective beside it (bench_tp_comm.py)
#   bash bench/run_gpu_2026-11-30-s5.sh gelu   # both configs with the anchor's model (tanh GELU)
#       and both anchors' compiled runs beside them, GPTModel's chunked CE vs plain logits;
#       DP = 2 with the whole model compiled (+- gradient_accumulation_fusion)
#   bash bench/run_gpu_2026-11-30-s5.sh groups # coordinate-descent tuning of the whole model;
#       layers compiled 6 per graph (+- CUDA graphs) on one GPU and DP = 2; anchor beside them
#   bash bench/run_gpu_2026-11-30-s5.sh final  # whole model compiled around layer groups
#       (graphs stop around each 6 or 12 layers: DDP buckets start per group), one GPU and DP = 2;
#       both anchors and both configs' one-GPU standing beside them
#   bash bench/run_gpu_2026-11-30-s5.sh split  # uneven layer groups (a short first group: less
#       DDP communication left after the last backward graph), DP = 2 and the one-GPU reference
#   bash bench/run_gpu_2026-11-30-s5.sh next   # NOT RUN YET (for the next session): repeat the
#       DP = 2 layer-group splits with one-GPU references (4,20 ran out of its 70 s limit in
#       s5-call5: the first DP run compiles cold); A/B of --row-bias-in-gemm, GPUs swapped
#
# Results: one JSON object a line in $OUT/results.jsonl; logs in $OUT.
source bench/_run_lib.sh

T="torchrun --nproc-per-node 2 --master-port 29651 bench/bench_gpt.py"
L13="--config gpt-1.3b $NC"

ce_micro() {
  unset CUDA_VISIBLE_DEVICES
  run ce.log 90 torchrun --nproc-per-node 2 --master-port 29661 bench/bench_tp_comm.py
  CUDA_DEVICE_MAX_CONNECTIONS=1 run ce.log 60 torchrun --nproc-per-node 2 --master-port 29662 \
    bench/bench_tp_comm.py
}

gelu_gpu0() {
  export CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29921
  local G="--compile model --gelu tanh"
  run refs.log 110 $B $L13 $G --ce chunked --label fast-compile-model-tanh
  run refs.log 110 $B $L13 $G --ce plain --label fast-compile-model-tanh-plain-ce
  run anchors.log 100 python3 $A/torch_baseline_bench.py gpt-1.3b compile
}

gelu_gpu1() {
  export CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29931
  local G="--config gpt-125m $NC --compile model --gelu tanh"
  run refs.log 90 $B $G --ce chunked --label fast-compile-model-tanh
  run refs.log 90 $B $G --ce plain --label fast-compile-model-tanh-plain-ce
  run anchors.log 90 python3 $A/torch_baseline_bench.py gpt-125m compile
}

dp_model() {
  unset CUDA_VISIBLE_DEVICES
  local D="--overlap-grad-reduce --bucket-size 100000000 --compile model --gelu tanh --ce chunked"
  run dp.log 120 $T $L13 $D --label fast-dp2-model-tanh
  run dp.log 120 $T $L13 $D --grad-acc-fusion --label fast-dp2-model-tanh-gaf
}

groups_gpu0() {
  export CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29921
  local G="$L13 --gelu tanh --ce chunked"
  run refs.log 160 $B $G --compile model --inductor-tuning --label fast-compile-model-tanh-cdt
  run refs.log 100 $B $G --compile layers --layers-per-graph 6 --label fast-groups6-tanh
  run refs.log 100 $B $G --compile layers --layers-per-graph 6 --compile-mode reduce-overhead \
    --label fast-groups6-tanh-cudagraphs
}

groups_gpu1() {
  export CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29931
  run refs.log 100 $B $L13 --gelu tanh --ce chunked --compile model --label fast-compile-model-tanh
  run refs.log 120 $B --config gpt-125m $NC --gelu tanh --ce chunked --compile model \
    --inductor-tuning --label fast-compile-model-tanh-cdt
  run anchors.log 100 python3 $A/torch_baseline_bench.py gpt-1.3b compile
}

groups_dp() {
  unset CUDA_VISIBLE_DEVICES
  local D="--overlap-grad-reduce --bucket-size 100000000 --gelu tanh --ce chunked"
  run dp.log 100 $T $L13 $D --compile layers --layers-per-graph 6 --label fast-dp2-groups6-tanh
  run dp.log 100 $T $L13 $D --compile layers --layers-per-graph 6 --compile-mode reduce-overhead \
    --label fast-dp2-groups6-tanh-cudagraphs
}

final_gpu0() {
  export CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29921
  local G="$L13 --gelu tanh --ce chunked --compile model"
  run refs.log 100 $B $G --label fast-compile-model-tanh
  run refs.log 110 $B $G --layers-per-graph 6 --label fast-compile-model-groups6-tanh
}

final_gpu1() {
  export CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29931
  run anchors.log 100 python3 $A/torch_baseline_bench.py gpt-1.3b compile
  run refs.log 90 $B --config gpt-125m $NC --gelu tanh --ce chunked --compile model \
    --label fast-compile-model-tanh
  run anchors.log 90 python3 $A/torch_baseline_bench.py gpt-125m compile
}

final_dp() {
  unset CUDA_VISIBLE_DEVICES
  local D="--overlap-grad-reduce --bucket-size 100000000 --gelu tanh --ce chunked --compile model"
  run dp.log 120 $T $L13 $D --layers-per-graph 6 --label fast-dp2-model-groups6-tanh
  run dp.log 120 $T $L13 $D --layers-per-graph 12 --label fast-dp2-model-groups12-tanh
}

# one_gpu GPU PORT LIMIT LABEL FLAGS...: gpt-1.3b with the anchor's model, whole model compiled
one_gpu() {
  local gpu=$1 port=$2 lim=$3 label=$4
  shift 4
  CUDA_VISIBLE_DEVICES=$gpu MASTER_PORT=$port run refs.log "$lim" $B $L13 --gelu tanh --ce chunked \
    --compile model --label "$label" "$@"
}

# dp_runs LIMIT SPLIT...: DP = 2, the whole model compiled around each layer-group split
dp_runs() {
  local lim=$1 split
  shift
  for split in "$@"; do
    run dp.log "$lim" $T $L13 --gelu tanh --ce chunked --compile model --overlap-grad-reduce \
      --bucket-size 100000000 --layers-per-graph "$split" \
      --label "fast-dp2-model-groups${split/,/-}-tanh"
  done
}

split_calls() {
  one_gpu 0 29921 85 fast-compile-model-tanh
  dp_runs 70 4,20 2,22
}

next_calls() {  # A/B of --row-bias-in-gemm on both GPUs, swapped after the DP runs
  one_gpu 0 29921 110 fast-compile-model-tanh &
  one_gpu 1 29931 110 fast-compile-model-tanh-row-bias --row-bias-in-gemm &
  wait
  dp_runs 110 2,22 4,20 2,22
  one_gpu 0 29921 90 fast-compile-model-tanh-row-bias --row-bias-in-gemm &
  one_gpu 1 29931 90 fast-compile-model-tanh &
  wait
}

case "${1:-}" in
  next) next_calls ;;
  split) split_calls ;;
  final) final_gpu0 & final_gpu1 & wait; final_dp ;;
  groups) groups_gpu0 & groups_gpu1 & wait; groups_dp ;;
  ce) ce_micro ;;
  gelu) gelu_gpu0 & gelu_gpu1 & wait; dp_model ;;
  *) echo "usage: $0 ce|gelu|groups|final|split|next" >&2; exit 2 ;;
esac
python3 bench/compare.py "$RES" 2>/dev/null | tail -40
