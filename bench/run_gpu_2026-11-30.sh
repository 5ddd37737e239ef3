#!/usr/bin/env bash
# The GPU measurements of bench/reports/2026-11-30-*.md, in device calls (repo root, kind
# nvidia-h200-x2, carry=[".whl"] for the megatron-core 0.19.2 wheel).
#
#   bash bench/run_gpu_2026-11-30.sh call1   # two one-GPU lanes at once, then both GPUs:
#       GPU 0: gigatron fast-path variants + kernel profiles with GPU idle gaps and host syncs
#       GPU 1: torch-compile anchors, MoE (sequential vs grouped), CP = 1 memory at long
#              sequences, tests/gpu; then the alias example on 2 GPUs (issue 10)
#   bash bench/run_gpu_2026-11-30.sh call2   # both GPUs: DP = 2, TP = 2 + SP, CP = 2 modes,
#                                            # checkpoint throughput
#
# Results: one JSON object a line in $OUT/results.jsonl; logs in $OUT/*.log.
set -u
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
RES="$OUT/results.jsonl"
export GIGATRON_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)

# run LOG LIMIT_S CMD...: one benchmark; keep its RESULT line; never stop the script.
run() {
  local log=$1 limit=$2
  shift 2
  local tmp="/tmp/run-$log-$$.txt"
  echo "=== $* ($(date -u +%T))" >>"$OUT/$log"
  timeout "$limit" "$@" >"$tmp" 2>&1
  local rc=$?
  tail -c 20000 "$tmp" >>"$OUT/$log"
  local line
  line=$(grep -h '^RESULT ' "$tmp" | tail -1 | sed 's/^RESULT //')
  if [ $rc -eq 0 ] && [ -n "$line" ]; then echo "$line" >>"$RES"; else
    echo "{\"failed\": \"$*\", \"rc\": $rc}" >>"$RES"; fi
}

B="python3 bench/bench_gpt.py"
A=bench/anchors
NC="--no-input-checks"

lane_fast() {
  export CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29601
  run fast.log 240 $B --config gpt-1.3b --profile "$OUT/profile-1.3b.json" --sync-debug --label fast-profiled
  run fast.log 200 $B --config gpt-1.3b $NC --label fast-nochecks
  run fast.log 240 $B --config gpt-1.3b $NC --optimizer compiled --label fast-compiled-adamw
  run fast.log 200 $B --config gpt-1.3b $NC --ce chunked-recompute --label fast-ce-recompute
  run fast.log 240 $B --config gpt-1.3b $NC --compile model --label fast-compile-model
  run fast.log 240 $B --config gpt-1.3b $NC --compile-mode reduce-overhead --label fast-cudagraphs
  run fast.log 200 $B --config gpt-125m --profile "$OUT/profile-125m.json" --label fast-profiled
  run fast.log 200 $B --config gpt-125m $NC --compile model --label fast-compile-model
  run fast.log 240 $B --config gpt-125m $NC --compile model --compile-mode reduce-overhead \
    --label fast-compile-model-cudagraphs
  run fast.log 200 $B --config gpt-125m $NC --compile model --ce chunked-recompute \
    --label fast-compile-model-ce-recompute
}

lane_other() {
  export CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29611
  for c in gpt-1.3b gpt-125m; do run anchors.log 240 python3 $A/torch_baseline_bench.py $c compile; done
  run moe.log 300 python3 bench/bench_moe.py --config moe-8x-h200
  local CP="torchrun --nproc-per-node 1 --master-port 29612 bench/bench_cp.py --device cuda"
  CP="$CP --level gpt --config gpt-1.3b --dtype bf16 --train --cp 1 --modes p2p"
  run cp1.log 240 $CP --seq 131072 --recompute --warmup 0 --iters 1
  run cp1.log 120 $CP --seq 32768 --warmup 1 --iters 1
  run cp1.log 120 $CP --seq 32768 --recompute --warmup 1 --iters 1
  echo "=== pytest tests/gpu ($(date -u +%T))" >>"$OUT/tests.log"
  timeout 240 python3 -m pytest tests/gpu -q -p no:cacheprovider >>"$OUT/tests.log" 2>&1
  tail -3 "$OUT/tests.log"
}

alias_two_gpus() {
  echo "=== alias example on 2 GPUs ($(date -u +%T))" >>"$OUT/alias.log"
  timeout 200 torchrun --nproc-per-node 2 --master-port 29620 -m gigatron.compat.megatron \
    examples/run_simple_mcore_train_loop.py --ckpt-dir /tmp/alias-ckpt >>"$OUT/alias.log" 2>&1
  echo "rc=$?" >>"$OUT/alias.log"
  echo "=== pytest alias example on 2 GPUs ($(date -u +%T))" >>"$OUT/tests.log"
  timeout 240 python3 -m pytest tests/dist/test_examples.py -m gpu -q -p no:cacheprovider \
    -k two_gpus >>"$OUT/tests.log" 2>&1
  tail -3 "$OUT/tests.log"
}

case "${1:-}" in
  call1)
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    lane_fast &
    lane_other &
    wait
    alias_two_gpus
    ;;
  *)
    echo "usage: $0 call1|call2" >&2
    exit 2
    ;;
esac
python3 bench/compare.py "$RES" 2>/dev/null | tail -40
