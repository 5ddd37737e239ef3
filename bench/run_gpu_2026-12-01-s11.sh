#!/usr/bin/env bash
# Session 11 GPU runs (bench/reports/2026-12-01-s11-gpu.md), device kind nvidia-h200-x2, from
# the repo root:
#
#   bash bench/run_gpu_2026-12-01-s11.sh verify  # call 1: what session 10 fixed for torch 2.11
#       but could not re-run: the one-GPU targets beside the torch.compile anchor (GPU 0 / GPU 1
#       at the same time); pretrain_gpt on DP = 2 with the flat Adam step as the default (it
#       recompiled per shard before a3f7bd8); TP = 2 + SP with the compiled TP mappings' grads
#       fixed (1cbab78: they were zero on torch 2.11)
#   bash bench/run_gpu_2026-12-01-s11.sh tests   # call 2: every CUDA test (GPU 0) beside the
#       CUDA resume test (GPU 1)
#   bash bench/run_gpu_2026-12-01-s11.sh dp2     # call 3: after b3f00bb (DDP's param-gather
#       hooks no longer traced): pretrain_gpt on one GPU (GPU 0, the whole model compiled; GPU 1
#       the same with --torch-compile-layers-per-graph 2,22), then DP = 2 with and without
#       --overlap-param-gather
#
# Results: one JSON object a line in $OUT/results.jsonl; logs in $OUT.
source bench/_run_lib.sh

T="torchrun --nproc-per-node 2 --master-port 29651 bench/bench_gpt.py"
BEST="$NC --gelu tanh --compile model --ce chunked"

verify() {
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
  NPROC=2 train_one 0,1 29921 170 default-nodrop-dp2 --clip-grad 1.0 --global-batch-size 8 \
    --overlap-grad-reduce --overlap-param-gather
  run tp.log 130 $T --config gpt-1.3b $BEST --tp 2 --sp --no-memory-reorder \
    --label fast-tp2-sp-model-tanh
}

tests() {
  (CUDA_VISIBLE_DEVICES=0 run_tests 400 tests/gpu -rf -k "not resume" --timeout 300) &
  (
    CUDA_VISIBLE_DEVICES=1 timeout 400 python3 -m pytest tests/gpu/test_training_resume_cuda.py \
      -q -p no:cacheprovider -rf >"$OUT/gpu-resume-test.log" 2>&1
    tail -5 "$OUT/gpu-resume-test.log"
  ) &
  wait
}

dp2() {
  train_one 0 29921 150 default-nodrop --clip-grad 1.0 &
  train_one 1 29931 150 default-nodrop-groups2-22 --clip-grad 1.0 \
    --torch-compile-layers-per-graph 2,22 &
  wait
  NPROC=2 train_one 0,1 29921 170 default-nodrop-dp2 --clip-grad 1.0 --global-batch-size 8 \
    --overlap-grad-reduce --overlap-param-gather
  NPROC=2 train_one 0,1 29921 150 default-nodrop-dp2-no-param-overlap --clip-grad 1.0 \
    --global-batch-size 8 --overlap-grad-reduce
}

case "${1:-}" in
  dp2) dp2 ;;
  verify) verify ;;
  tests) tests ;;
  *) echo "usage: $0 verify|tests|dp2" >&2; exit 2 ;;
esac
python3 bench/compare.py "$RES" 2>/dev/null | tail -40
