#!/usr/bin/env bash
# Session 5 GPU measurements of issue 9 (bench/reports/2026-11-30-s5-gpu.md), device kind
# nvidia-h200-x2, from the repo root:
#
#   bash bench/run_gpu_2026-11-30-s5.sh ce     # copy-engine TP collectives: bitwise check vs
#       NCCL (eager, compiled), then a GEMM with each collective beside it (bench_tp_comm.py)
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

case "${1:-}" in
  ce) ce_micro ;;
  *) echo "usage: $0 ce" >&2; exit 2 ;;
esac
python3 bench/compare.py "$RES" 2>/dev/null | tail -40
