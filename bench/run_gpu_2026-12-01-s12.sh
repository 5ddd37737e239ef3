#!/usr/bin/env bash
# Session 12 GPU runs (bench/reports/2026-12-01-s12-gpu.md), run at b319b9d: its --skip-guard-eval
# and --torch-compile-skip-guard-eval were removed after (no gain). Device kind nvidia-h200 (one GPU:
# the two-GPU kinds were withheld this session), from the repo root:
#
#   bash bench/run_gpu_2026-12-01-s12.sh bench  # call 1: the one-GPU targets (gpt-1.3b,
#       gpt-125m) after the anchor on the same GPU: the default fast path; the flat compiled
#       AdamW over DDP's grad buffer (--ddp on --optimizer flat, never measured on one GPU);
#       the timed steps without dynamo's guard checks (--skip-guard-eval)
#   bash bench/run_gpu_2026-12-01-s12.sh train  # call 2: pretrain_gpt at gpt-1.3b's shape: as
#       is; --torch-compile-skip-guard-eval; --torch-compile-mode reduce-overhead (CUDA graphs);
#       Megatron's default dropout 0.1 (the TP = 1 RNG fork no longer breaks the compiled graph)
#
# Results: one JSON object a line in $OUT/results.jsonl; logs in $OUT.
source bench/_run_lib.sh

BEST="$NC --gelu tanh --compile model --ce chunked"

bench() {
  for c in gpt-1.3b gpt-125m; do
    run anchors.log 100 python3 $A/torch_baseline_bench.py $c compile
    run refs.log 100 $B --config $c $BEST --label fast-compile-model-tanh
    run refs.log 100 $B --config $c $BEST --skip-guard-eval --label fast-skip-guard-eval
    run refs.log 100 $B --config $c $BEST --ddp on --optimizer flat --label fast-flat-adamw
  done
  nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv >>"$OUT/anchors.log"
}

train() {
  train_one 0 29921 120 default-nodrop --clip-grad 1.0
  train_one 0 29921 110 nodrop-skip-guard-eval --clip-grad 1.0 --torch-compile-skip-guard-eval
  train_one 0 29921 140 nodrop-cudagraphs --clip-grad 1.0 --torch-compile-mode reduce-overhead
  train_one 0 29921 120 dropout0.1 --clip-grad 1.0 --hidden-dropout 0.1 --attention-dropout 0.1
}

case "${1:-}" in
  bench) bench ;;
  train) train ;;
  *) echo "usage: $0 bench|train" >&2; exit 2 ;;
esac
python3 bench/compare.py "$RES" 2>/dev/null | tail -40
