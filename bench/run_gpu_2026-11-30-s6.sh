#!/usr/bin/env bash
# Session 6 GPU measurements of issue 9 (bench/reports/2026-11-30-s6-gpu.md), device kind
# nvidia-h200-x2, from the repo root:
#
#   bash bench/run_gpu_2026-11-30-s6.sh ce13   # GPU tests of the grad-in-forward cross entropy
#       and the copy-engine routing; gpt-1.3b --ce chunked vs chunked-grad-in-forward on both
#       GPUs, swapped; the compiled anchor beside them
#   bash bench/run_gpu_2026-11-30-s6.sh ce125  # the same A/B for gpt-125m with its anchor; a
#       kernel profile of gpt-1.3b with grad-in-forward; DP = 2 gpt-1.3b with it (groups 2,22)
#   bash bench/run_gpu_2026-11-30-s6.sh mt     # NOT RUN YET (run first): MultiTensorAdamW (one
#       Triton launch over all param tensors): GPU tests, bench_adamw.py (all AdamW variants,
#       both configs), gpt-1.3b with --optimizer multi-tensor vs torch fused AdamW on both GPUs
#       (swapped), DP = 2 with it (layer groups 2,22)
#   bash bench/run_gpu_2026-11-30-s6.sh flat   # NOT RUN YET (next session): FlatAdamW (AdamW over
#       DDP's flat grad buffers, one compiled pass per buffer): its GPU tests; one GPU without DDP
#       (torch fused AdamW, the reference) and with DDP + --optimizer flat, on both GPUs; DP = 2
#       with --optimizer flat and with torch fused AdamW (layer groups 2,22)
#   bash bench/run_gpu_2026-11-30-s6.sh nccl   # NOT RUN YET: in the TP = 2 + SP step each
#       all-gather / reduce-scatter of 16 MiB takes 108 / 137 us (~150 GB/s; NVLink should give
#       2-3x): sweep NCCL_PROTO / channels / buffer size with bench_tp_comm.py --nccl-only, then
#       gpt-1.3b TP = 2 + SP with the fastest setting (± --tp-comm-overlap) and the default one
#   bash bench/run_gpu_2026-11-30-s6.sh gemmgap  # NOT RUN YET: why every GEMM class runs 4-6%
#       longer in gigatron's step than in the anchor's: the layer GEMMs in isolation with both
#       init distributions (bench_gemm_shapes.py), gigatron with Megatron's and with the anchor's
#       init (--anchor-init), the anchor; SM clock / power sampled by nvidia-smi (smi.csv, align
#       with the start times in the logs); kernel profiles of gpt-125m and its anchor
#
# Results: one JSON object a line in $OUT/results.jsonl; logs in $OUT.
source bench/_run_lib.sh

T="torchrun --nproc-per-node 2 --master-port 29651 bench/bench_gpt.py"

# one GPU CONFIG GPU PORT LIMIT LABEL FLAGS...: the anchor's model (tanh GELU), whole model compiled
one() {
  local config=$1 gpu=$2 port=$3 lim=$4 label=$5
  shift 5
  CUDA_VISIBLE_DEVICES=$gpu MASTER_PORT=$port run refs.log "$lim" $B --config "$config" $NC \
    --gelu tanh --compile model --label "$label" "$@"
}

anchor() {  # anchor CONFIG GPU LIMIT
  CUDA_VISIBLE_DEVICES=$2 run anchors.log "$3" python3 $A/torch_baseline_bench.py "$1" compile
}

ce13() {
  run_tests 200 tests/unit/test_ce_grad_in_forward.py tests/gpu/test_chunked_cross_entropy.py \
    tests/gpu/test_ce_collectives.py -m gpu
  one gpt-1.3b 0 29921 110 fast-compile-model-tanh --ce chunked &
  one gpt-1.3b 1 29931 110 fast-compile-model-tanh-ce-fwd-grad --ce chunked-grad-in-forward &
  wait
  one gpt-1.3b 0 29921 90 fast-compile-model-tanh-ce-fwd-grad --ce chunked-grad-in-forward &
  one gpt-1.3b 1 29931 90 fast-compile-model-tanh --ce chunked &
  wait
  anchor gpt-1.3b 0 100 &
  one gpt-1.3b 1 29931 90 fast-compile-model-tanh-ce-fwd-grad --ce chunked-grad-in-forward &
  wait
}

ce125() {
  one gpt-125m 0 29921 100 fast-compile-model-tanh --ce chunked &
  one gpt-125m 1 29931 100 fast-compile-model-tanh-ce-fwd-grad --ce chunked-grad-in-forward &
  wait
  one gpt-125m 0 29921 80 fast-compile-model-tanh-ce-fwd-grad --ce chunked-grad-in-forward &
  one gpt-125m 1 29931 80 fast-compile-model-tanh --ce chunked &
  wait
  anchor gpt-125m 0 90 &
  one gpt-1.3b 1 29931 110 fast-compile-model-tanh-ce-fwd-grad-profiled \
    --ce chunked-grad-in-forward --profile "$OUT/profile-1.3b-ce-fwd-grad.json" &
  wait
  unset CUDA_VISIBLE_DEVICES
  run dp.log 130 $T --config gpt-1.3b $NC --gelu tanh --ce chunked-grad-in-forward \
    --compile model --overlap-grad-reduce --bucket-size 100000000 --layers-per-graph 2,22 \
    --label fast-dp2-model-groups2-22-tanh-ce-fwd-grad
}

flat() {
  run_tests 120 tests/dist/test_flat_adamw.py -m gpu
  one gpt-1.3b 0 29921 110 fast-compile-model-tanh --ce chunked &
  one gpt-1.3b 1 29931 110 fast-compile-model-tanh-ddp-flat-adamw --ce chunked --ddp on \
    --optimizer flat &
  wait
  unset CUDA_VISIBLE_DEVICES
  local D="--config gpt-1.3b $NC --gelu tanh --ce chunked --compile model --overlap-grad-reduce"
  D="$D --bucket-size 100000000 --layers-per-graph 2,22"
  run dp.log 130 $T $D --optimizer flat --label fast-dp2-model-groups2-22-tanh-flat-adamw
  run dp.log 90 $T $D --label fast-dp2-model-groups2-22-tanh
  # the DDP grad copy alone: DDP + torch fused AdamW beside DDP + FlatAdamW, GPUs swapped
  one gpt-1.3b 0 29921 80 fast-compile-model-tanh-ddp-flat-adamw --ce chunked --ddp on \
    --optimizer flat &
  one gpt-1.3b 1 29931 80 fast-compile-model-tanh-ddp --ce chunked --ddp on &
  wait
}

mt() {
  run_tests 150 tests/unit/test_multi_tensor_adamw.py tests/dist/test_flat_adamw.py -m gpu
  CUDA_VISIBLE_DEVICES=0 run adamw.log 150 python3 bench/bench_adamw.py --config gpt-1.3b &
  CUDA_VISIBLE_DEVICES=1 run adamw.log 120 python3 bench/bench_adamw.py --config gpt-125m &
  wait
  one gpt-1.3b 0 29921 110 fast-compile-model-tanh --ce chunked &
  one gpt-1.3b 1 29931 110 fast-compile-model-tanh-mt-adamw --ce chunked --optimizer multi-tensor &
  wait
  one gpt-1.3b 0 29921 80 fast-compile-model-tanh-mt-adamw --ce chunked --optimizer multi-tensor &
  one gpt-1.3b 1 29931 80 fast-compile-model-tanh --ce chunked &
  wait
  unset CUDA_VISIBLE_DEVICES
  run dp.log 130 $T --config gpt-1.3b $NC --gelu tanh --ce chunked --compile model \
    --overlap-grad-reduce --bucket-size 100000000 --layers-per-graph 2,22 \
    --optimizer multi-tensor --label fast-dp2-model-groups2-22-tanh-mt-adamw
}

NCCL_SWEEP=(
  "NCCL_DEBUG=WARN"
  "NCCL_PROTO=Simple"
  "NCCL_PROTO=LL128"
  "NCCL_PROTO=Simple NCCL_MIN_NCHANNELS=32"
  "NCCL_PROTO=LL128 NCCL_MIN_NCHANNELS=32"
  "NCCL_PROTO=Simple NCCL_MIN_NCHANNELS=8 NCCL_MAX_NCHANNELS=8"
  "NCCL_PROTO=Simple NCCL_BUFFSIZE=16777216 NCCL_MIN_NCHANNELS=32"
)

nccl() {
  unset CUDA_VISIBLE_DEVICES
  local e
  for e in "${NCCL_SWEEP[@]}"; do
    # shellcheck disable=SC2086  (word splitting of the assignments is intended)
    run nccl.log 45 env $e torchrun --nproc-per-node 2 --master-port 29671 \
      bench/bench_tp_comm.py --nccl-only
  done
  local best
  best=$(python3 - "$RES" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "nccl_all_gather_ms" in l]
best = min(rows, key=lambda r: r["nccl_all_gather_ms"] + r["nccl_reduce_scatter_ms"])
print(" ".join(f"{k}={v}" for k, v in best["nccl_env"].items()
               if k.startswith("NCCL_") and k not in ("NCCL_VERSION", "NCCL_NVLS_ENABLE")))
PY
)
  echo "fastest NCCL setting: $best" >>"$OUT/nccl.log"
  local TP="--config gpt-1.3b $NC --gelu tanh --ce chunked --compile model --tp 2 --sp"
  TP="$TP --no-memory-reorder"
  # shellcheck disable=SC2086
  run tp.log 130 env $best $T $TP --label fast-tp2-sp-model-tanh-best-nccl
  run tp.log 90 $T $TP --label fast-tp2-sp-model-tanh
  one gpt-1.3b 0 29921 90 fast-compile-model-tanh --ce chunked
  # shellcheck disable=SC2086
  run tp.log 90 env $best CUDA_DEVICE_MAX_CONNECTIONS=1 $T $TP --tp-comm-overlap \
    --label fast-tp2-sp-model-tanh-best-nccl-overlap
}

gemmgap() {
  nvidia-smi --query-gpu=index,timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
    --format=csv,noheader -lms 250 >"$OUT/smi.csv" &
  local smi=$!
  gap_gpu 0 gpt-1.3b 29921 110 &
  local g0=$!
  gap_gpu 1 gpt-125m 29931 100 &
  local g1=$!
  wait "$g0" "$g1"
  kill "$smi"
}

gap_gpu() {  # gap_gpu GPU CONFIG PORT LIMIT: isolated GEMMs, both inits, the anchor
  local gpu=$1 config=$2 port=$3 lim=$4
  CUDA_VISIBLE_DEVICES=$gpu run gemm.log 90 python3 bench/bench_gemm_shapes.py --config "$config"
  one "$config" "$gpu" "$port" "$lim" fast-compile-model-tanh --ce chunked
  one "$config" "$gpu" "$port" 90 fast-compile-model-tanh-anchor-init --ce chunked --anchor-init
  anchor "$config" "$gpu" 100
  if [ "$config" = gpt-125m ]; then  # no profile of gpt-125m's current fast path exists yet
    one "$config" "$gpu" "$port" 90 fast-compile-model-tanh-profiled --ce chunked \
      --profile "$OUT/profile-gigatron-gpt-125m.json"
    CUDA_VISIBLE_DEVICES=$gpu run anchors.log 90 python3 bench/compare_profile.py gpt-125m compile \
      "$OUT/profile-torch-compile-gpt-125m.json"
  fi
}

case "${1:-}" in
  ce13) ce13 ;;
  ce125) ce125 ;;
  mt) mt ;;
  flat) flat ;;
  gemmgap) gemmgap ;;
  nccl) nccl ;;
  *) echo "usage: $0 ce13|ce125|mt|flat|gemmgap|nccl" >&2; exit 2 ;;
esac
python3 bench/compare.py "$RES" 2>/dev/null | tail -40
