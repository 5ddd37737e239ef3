#!/usr/bin/env bash
# Every GPU measurement of bench/reports/*-gpu.md in one device call (run from the repo root).
#
#   bash bench/run_gpu.sh single   # kind nvidia-h200-x2: two lanes at once, one GPU each:
#                                  #   GPU 0 gigatron (fast, plain, ablations, profile),
#                                  #   GPU 1 the anchors (megatron-core local, torch eager/compile)
#                                  #   then tests/gpu on GPU 1
#   bash bench/run_gpu.sh multi    # both GPUs: DP=2 (overlap on/off), TP=2+SP, megatron TP=2
#   bash bench/run_gpu.sh round2   # whole-model compile, kernel profiles (both lanes at once)
#   bash bench/run_gpu.sh final    # Inductor tuning, tests/gpu, TP=2+SP with compiled layers
#
# Results: one JSON object a line in $OUT/results.jsonl (the benchmarks' RESULT lines), logs
# in $OUT/*.log, kernel tables in $OUT/profile-*.json; bench/compare.py prints the ratios.
# The megatron-core 0.19.2 wheel travels in .whl (carry=[".whl"]); see bench/anchors/README.md.
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

# run LOG CMD...: run one benchmark, keep its RESULT line, never stop the script on failure.
run() {
  local log=$1
  shift
  local tmp="/tmp/run-$log.txt"
  echo "=== $* ($(date -u +%T))" >>"$OUT/$log"
  timeout 300 "$@" >"$tmp" 2>&1
  local rc=$?
  cat "$tmp" >>"$OUT/$log"
  local line
  line=$(grep -h '^RESULT ' "$tmp" | tail -1 | sed 's/^RESULT //')
  if [ $rc -eq 0 ] && [ -n "$line" ]; then echo "$line" >>"$RES"; else
    echo "{\"failed\": \"$*\", \"rc\": $rc}" >>"$RES"; fi
}

B="python3 bench/bench_gpt.py"
A=bench/anchors

lane_gigatron() {
  export CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29601
  for c in gpt-1.3b gpt-125m; do run gigatron.log $B --config $c --impl fast; done
  for c in gpt-1.3b gpt-125m; do run gigatron.log $B --config $c --impl plain; done
  run gigatron.log $B --config llama-1b --impl fast
  run gigatron.log $B --config gpt-1.3b --impl fast --profile "$OUT/profile-gpt-1.3b.json" \
    --label fast-profiled
  # Ablations: one fast-path piece off at a time.
  run gigatron.log $B --config gpt-1.3b --impl fast --sdpa default --label fast-sdpa-default
  run gigatron.log $B --config gpt-1.3b --impl fast --ce plain --label fast-ce-plain
  run gigatron.log $B --config gpt-1.3b --impl fast --compile none --label fast-eager
}

lane_anchors() {
  export CUDA_VISIBLE_DEVICES=1
  for c in gpt-1.3b gpt-125m; do
    run anchors.log torchrun --nproc-per-node 1 --master-port 29611 $A/megatron_core_bench.py $c
    run anchors.log python3 $A/torch_baseline_bench.py $c compile
    run anchors.log python3 $A/torch_baseline_bench.py $c eager
  done
  echo "=== pytest tests/gpu ($(date -u +%T))" >>"$OUT/tests.log"
  timeout 240 python3 -m pytest tests/gpu -q -p no:cacheprovider >>"$OUT/tests.log" 2>&1
  tail -3 "$OUT/tests.log"
}

# Second round: whole-model compile, kernel profiles of gigatron and the torch-compile anchor.
lane_profiles_gigatron() {
  export CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29602
  for c in gpt-1.3b gpt-125m; do
    run gigatron.log $B --config $c --impl fast --compile model --label fast-compile-model
    run gigatron.log $B --config $c --impl fast --profile "$OUT/profile-gigatron-$c.json" \
      --label fast-profiled
  done
  run gigatron.log $B --config llama-1b --impl plain
}

lane_profiles_anchor() {
  export CUDA_VISIBLE_DEVICES=1
  for c in gpt-1.3b gpt-125m; do
    run anchors.log python3 bench/compare_profile.py $c compile "$OUT/profile-torch-compile-$c.json"
  done
  timeout 240 python3 -m pytest tests/gpu -q -p no:cacheprovider >>"$OUT/tests.log" 2>&1
  tail -3 "$OUT/tests.log"
}

# Third round: Inductor coordinate-descent tuning (GPU 0) beside tests/gpu (GPU 1), then TP=2+SP
# with compiled layers (graph breaks at the async TP collectives).
final() {
  (
    export CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29603
    for c in gpt-1.3b gpt-125m; do
      run gigatron.log $B --config $c --impl fast --inductor-tuning --label fast-inductor-tuning
    done
  ) &
  (
    export CUDA_VISIBLE_DEVICES=1
    timeout 240 python3 -m pytest tests/gpu -q -p no:cacheprovider >>"$OUT/tests.log" 2>&1
    tail -3 "$OUT/tests.log"
  ) &
  wait
  run multi.log torchrun --nproc-per-node 2 --master-port 29622 bench/bench_gpt.py \
    --config gpt-1.3b --impl fast --tp 2 --sp --label fast-tp2-sp
}

# Check of the chunked-CE change after the report's runs (kind nvidia-h200, one GPU).
check() {
  run gigatron.log $B --config gpt-125m --impl fast --label fast-ce-v2
  run gigatron.log $B --config gpt-1.3b --impl fast --ce chunked-recompute --label fast-ce-recompute
  timeout 60 python3 -m pytest tests/gpu/test_chunked_cross_entropy.py -q -p no:cacheprovider \
    -k cuda >>"$OUT/tests.log" 2>&1
  tail -1 "$OUT/tests.log"
}

multi() {
  unset CUDA_VISIBLE_DEVICES
  local T="torchrun --nproc-per-node 2 --master-port 29621"
  run multi.log $B --config gpt-125m --impl fast --label fast-1gpu-here
  run multi.log $T bench/bench_gpt.py --config gpt-125m --impl fast --overlap-grad-reduce \
    --label fast-dp2-overlap
  run multi.log $B --config gpt-1.3b --impl fast --label fast-1gpu-here
  run multi.log $T bench/bench_gpt.py --config gpt-1.3b --impl fast --overlap-grad-reduce \
    --label fast-dp2-overlap
  run multi.log $T bench/bench_gpt.py --config gpt-1.3b --impl fast --label fast-dp2-no-overlap
  run multi.log $T bench/bench_gpt.py --config gpt-1.3b --impl fast --tp 2 --sp --label fast-tp2-sp
  run multi.log $T bench/bench_gpt.py --config gpt-1.3b --impl fast --tp 2 --sp --compile none \
    --label fast-tp2-sp-eager
  run multi.log $T $A/megatron_core_bench.py gpt-1.3b
}

case "${1:-single}" in
  single)
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,power.draw --format=csv >"$OUT/gpu.log"
    lane_gigatron &
    lane_anchors &
    wait
    ;;
  multi) multi ;;
  final) final ;;
  check) check ;;
  round2)
    lane_profiles_gigatron &
    lane_profiles_anchor &
    wait
    ;;
  *) echo "usage: $0 single|multi|round2|final|check" && exit 2 ;;
esac
python3 bench/compare.py "$RES"
