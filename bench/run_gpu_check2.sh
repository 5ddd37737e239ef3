#!/usr/bin/env bash
# After the fast-path changes of 2026-11-29 22:44 (plain F.linear at TP=1, fused Adam in the
# optimizer, no token check under compile): gigatron fast vs the torch.compile anchor, one GPU.
set -u
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
RES="$OUT/results.jsonl"
run() {
  local log=$1; shift
  timeout 200 "$@" >"/tmp/r.txt" 2>&1; local rc=$?
  cat /tmp/r.txt >>"$OUT/$log"
  local line; line=$(grep -h '^RESULT ' /tmp/r.txt | tail -1 | sed 's/^RESULT //')
  if [ $rc -eq 0 ] && [ -n "$line" ]; then echo "$line" >>"$RES"; else
    echo "{\"failed\": \"$*\", \"rc\": $rc}" >>"$RES"; fi
}
for c in gpt-125m gpt-1.3b; do
  run gigatron.log python3 bench/bench_gpt.py --config $c --impl fast --compile model \
    --label fast-v3-compile-model
  run anchors.log python3 bench/anchors/torch_baseline_bench.py $c compile
done
run gigatron.log python3 bench/bench_gpt.py --config gpt-125m --impl fast --label fast-v3-layers
python3 bench/compare.py "$RES"
