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
source bench/_run_lib.sh  # environment, megatron-core wheel, run(), $B $A $NC

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

alias_direct() {
  echo "=== alias example on 2 GPUs ($(date -u +%T))" >>"$OUT/alias.log"
  rm -rf /tmp/alias-ckpt
  timeout 200 torchrun --nproc-per-node 2 --master-port 29620 -m gigatron.compat.megatron \
    examples/run_simple_mcore_train_loop.py --ckpt-dir /tmp/alias-ckpt >>"$OUT/alias.log" 2>&1
  echo "rc=$?" >>"$OUT/alias.log"
}

alias_two_gpus() {
  alias_direct
  echo "=== pytest alias example on 2 GPUs ($(date -u +%T))" >>"$OUT/tests.log"
  timeout 240 python3 -m pytest tests/dist/test_examples.py -m gpu -q -p no:cacheprovider \
    -k two_gpus >>"$OUT/tests.log" 2>&1
  tail -3 "$OUT/tests.log"
}

lane_refs() {  # call 2, GPU 0: one-GPU references, memory variant, CP = 1 at 131k, tests/gpu
  export CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29631
  run refs.log 150 $B --config gpt-1.3b $NC --label fast-nochecks
  run refs.log 150 $B --config gpt-125m $NC --label fast-nochecks
  run refs.log 180 $B --config gpt-1.3b $NC --compile model --ce chunked-recompute \
    --label fast-compile-model-ce-recompute
  run cp.log 120 torchrun --nproc-per-node 1 --master-port 29632 bench/bench_cp.py \
    --device cuda --level gpt --config gpt-1.3b --dtype bf16 --train --seq 131072 \
    --recompute-layers 12 --cp 1 --modes p2p --warmup 0 --iters 1
  echo "=== pytest tests/gpu/test_optimizer_cuda.py ($(date -u +%T))" >>"$OUT/tests.log"
  timeout 60 python3 -m pytest tests/gpu/test_optimizer_cuda.py -q -p no:cacheprovider \
    >>"$OUT/tests.log" 2>&1
  tail -3 "$OUT/tests.log"
}

lane_io() {  # call 2, GPU 1: MoE experts, checkpoint throughput
  export CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29641
  run moe.log 150 python3 bench/bench_moe.py --config moe-8x-h200
  run ckpt.log 200 python3 bench/bench_ckpt.py --config gpt-1.3b --device cuda --repeats 2 \
    --time-budget 120 --dir /tmp/ckpt-bench
}

two_gpus() {  # call 2, both GPUs
  unset CUDA_VISIBLE_DEVICES
  alias_direct
  local T="torchrun --nproc-per-node 2 --master-port 29651"
  run cp.log 170 $T bench/bench_cp.py --device cuda --level gpt --config gpt-1.3b --dtype bf16 \
    --train --seq 131072 --recompute-layers 12 --cp 2 --warmup 1 --iters 1
  run multi.log 120 $T bench/bench_gpt.py --config gpt-1.3b $NC --tp 2 --sp --fullgraph on \
    --label fast-tp2-sp-compiled
  run multi.log 100 $T bench/bench_gpt.py --config gpt-1.3b $NC --overlap-grad-reduce \
    --label fast-dp2-overlap
  run multi.log 90 $T bench/bench_gpt.py --config gpt-125m $NC --overlap-grad-reduce \
    --bucket-size 8000000 --label fast-dp2-overlap
}

call3_gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  echo "=== pytest tests/gpu ($(date -u +%T))" >>"$OUT/tests.log"
  timeout 200 python3 -m pytest tests/gpu -q -p no:cacheprovider >>"$OUT/tests.log" 2>&1
  tail -3 "$OUT/tests.log"
}

call3_gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  run ckpt.log 230 python3 bench/bench_ckpt.py --config gpt-1.3b --device cuda --repeats 2 \
    --time-budget 160 --dir /tmp/ckpt-bench
}

call3_two_gpus() {
  unset CUDA_VISIBLE_DEVICES
  alias_two_gpus
  echo "=== pytest -m gpu TP compile / NCCL ($(date -u +%T))" >>"$OUT/tests.log"
  timeout 150 python3 -m pytest -m gpu tests/dist/test_tp_compile.py tests/dist/test_tp_nccl.py \
    -q -p no:cacheprovider >>"$OUT/tests.log" 2>&1
  tail -3 "$OUT/tests.log"
  local T="torchrun --nproc-per-node 2 --master-port 29661"
  NCCL_MAX_CTAS=8 NCCL_MIN_CTAS=8 run multi.log 100 $T bench/bench_gpt.py --config gpt-1.3b \
    $NC --overlap-grad-reduce --label fast-dp2-overlap-ctas8
  run multi.log 100 $T bench/bench_gpt.py --config gpt-1.3b $NC --overlap-grad-reduce \
    --bucket-size 100000000 --label fast-dp2-overlap-bucket100m
}

case "${1:-}" in
  call1)
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    lane_fast &
    lane_other &
    wait
    alias_two_gpus
    ;;
  call2)
    lane_refs &
    lane_io &
    wait
    two_gpus
    ;;
  call3)
    call3_gpu0 &
    call3_gpu1 &
    wait
    call3_two_gpus
    ;;
  *)
    echo "usage: $0 call1|call2|call3" >&2
    exit 2
    ;;
esac
python3 bench/compare.py "$RES" 2>/dev/null | tail -40
