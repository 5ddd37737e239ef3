#!/usr/bin/env bash
# Benchmark runner: named targets, run from the repo root (on the device machine for GPU ones).
#
#   bash bench/run.sh list                 # the targets, one line each
#   bash bench/run.sh gpt train            # several targets, in order, in one device call
#   BUDGET_S=500 bash bench/run.sh gpt     # end the whole run before the call's limit
#
# Each benchmark prints a `RESULT {json}` line; the runner keeps it in $OUT/results.jsonl (a
# failed or skipped run leaves a {"failed"|"skipped": ...} line instead), logs in $OUT/*.log,
# and ends with `python3 bench/tools/compare.py $OUT/results.jsonl` (tables, ratios to the anchors,
# the targets). The anchors (bench/anchors) always run in the same call as gigatron, on the same
# GPU, one after the other. The megatron-core 0.19.2 wheel travels in .whl/ (carry it:
# bench/anchors/README.md). Kinds: targets marked [2 GPUs] need nvidia-h200-x2; [CPU] need none.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
# no NVLink multicast on these machines (NCCL NVLS / symmetric memory would hang or slow down)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
RES="$OUT/results.jsonl"
GIGATRON_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
export GIGATRON_COMMIT
START=$(date +%s)
END=$((START + ${BUDGET_S:-575}))  # the whole run ends before the device call's 600 s limit

B="python3 bench/gpt/bench_gpt.py"
T2="torchrun --nproc-per-node 2 --master-port 29651 bench/gpt/bench_gpt.py"
A=bench/anchors
# the best one-GPU path, the anchor's model (tanh GELU); the figure every report quotes
BEST="--no-input-checks --gelu tanh --compile model --ce chunked"
# DP = 2: layer groups 2,22 start DDP's buckets early; the embedding's bucket overlaps the update
DP2="--overlap-grad-reduce --bucket-size 100000000 --layers-per-graph 2,22 --optimizer flat-overlap"

_megatron_wheel() {  # install the carried megatron-core wheel once (the anchors need it)
  if ls .whl/*.whl >/dev/null 2>&1 && [ -z "${PYTHONPATH:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  fi
}

_left() { echo $((END - $(date +%s))); }

# run LOG LIMIT_S CMD...: one benchmark; keep its RESULT line; never stop the runner. The limit
# shrinks to what is left of the budget; a run with under 25 s left is skipped.
run() {
  local log=$1 limit=$2
  shift 2
  local left
  left=$(_left)
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 25 ]; then echo "{\"skipped\": \"$*\"}" >>"$RES"; return; fi
  local tmp="/tmp/run-$log-$$-$RANDOM.txt"
  echo "=== $* ($(date -u +%T))" >>"$OUT/$log"
  timeout "$limit" "$@" >"$tmp" 2>&1
  local rc=$?
  tail -c 20000 "$tmp" >>"$OUT/$log"
  local line
  line=$(grep -h '^RESULT ' "$tmp" | tail -1 | sed 's/^RESULT //')
  if [ $rc -eq 0 ] && [ -n "$line" ]; then echo "$line" >>"$RES"; else
    echo "{\"failed\": \"$*\", \"rc\": $rc}" >>"$RES"; fi
}

# run_tests LIMIT_S PYTEST_ARGS...: one pytest run, output in $OUT/tests.log (last lines echoed)
run_tests() {
  local limit=$1
  shift
  echo "=== pytest $* ($(date -u +%T))" >>"$OUT/tests.log"
  timeout "$limit" python3 -m pytest "$@" -q -p no:cacheprovider >>"$OUT/tests.log" 2>&1
  tail -3 "$OUT/tests.log"
}

# pretrain_gpt at gpt-1.3b's shape (TRAIN_SHAPE overrides it for a CPU dry run); 50 iterations,
# logged every 10: the last windows are past the whole-model compile
TRAIN_SHAPE=${TRAIN_SHAPE:-"--num-layers 24 --hidden-size 2048 --num-attention-heads 16 \
  --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 4 --global-batch-size 4 \
  --vocab-size 50304 --train-iters 50 --log-interval 10"}
PROF="--profile --use-pytorch-profiler --profile-step-start 32 --profile-step-end 34"

# train_one LIMIT LABEL FLAGS...: pretrain_gpt with Megatron's flags (NPROC=2: DP = 2; ENTRY
# replaces `-m gigatron.training.pretrain_gpt`); its log windows -> a RESULT line
train_one() {
  local lim=$1 label=$2
  shift 2
  local log="$OUT/train-$label.log" entry=${ENTRY:--m gigatron.training.pretrain_gpt}
  local left
  left=$(_left)
  [ "$lim" -gt "$left" ] && lim=$left
  if [ "$lim" -lt 25 ]; then echo "{\"skipped\": \"train $label\"}" >>"$RES"; return; fi
  echo "=== train $label $* ($(date -u +%T))" >>"$OUT/train.log"
  # shellcheck disable=SC2086  (TRAIN_SHAPE and entry are lists of words)
  timeout "$lim" torchrun --nproc-per-node "${NPROC:-1}" --master-port 29921 $entry \
    $TRAIN_SHAPE --lr 1e-4 --min-lr 1e-5 --mock-data --bf16 --use-distributed-optimizer \
    --accumulate-allreduce-grads-in-fp32 --cross-entropy-loss-fusion --torch-compile model \
    --clip-grad 1.0 --weight-decay 0.1 --eval-iters 0 --eval-interval 100000 \
    --no-progress-bar "$@" >"$log" 2>&1
  grep -v "^W1\|warn" "$log" | tail -c 3000 >>"$OUT/train.log"
  { echo "=== $label $*"; grep -A40 "^profile: " "$log"; } >>"$OUT/profiles.txt"
  { echo "=== $label $*"; grep "sync-debug" "$log"; } >>"$OUT/syncs.txt"
  local line
  line=$(python3 bench/tools/parse_train_log.py "$log" --label "$label" --gpus "${NPROC:-1}" |
    sed -n 's/^RESULT //p')
  if [ -n "$line" ]; then echo "$line" >>"$RES"; else
    echo "{\"failed\": \"train $label\", \"rc\": 1}" >>"$RES"; fi
}

NODROP="--hidden-dropout 0 --attention-dropout 0"
DROP="--hidden-dropout 0.1 --attention-dropout 0.1"

# ---- targets: one function each; the comment after `()` is the `list` line ----------------

t_gpt() {  # gpt-1.3b and gpt-125m, best path, beside the torch.compile anchor (reports/gpt-1gpu-throughput.md)
  local c
  for c in gpt-1.3b gpt-125m; do
    run anchors.log 120 python3 $A/torch_baseline_bench.py $c compile
    run gpt.log 120 $B --config $c $BEST --label fast-compile-model-tanh
  done
}

t_anchors() {  # every anchor: megatron-core 0.19.2 local spec (needs .whl), plain torch eager and compiled
  _megatron_wheel
  local c
  for c in gpt-1.3b gpt-125m; do
    run anchors.log 150 torchrun --nproc-per-node 1 --master-port 29611 $A/megatron_core_bench.py $c
    run anchors.log 120 python3 $A/torch_baseline_bench.py $c eager
    run anchors.log 120 python3 $A/torch_baseline_bench.py $c compile
  done
}

t_gpt_ablations() {  # gpt-1.3b: the plain path, then the fast path with one piece off at a time
  local L="--config gpt-1.3b --no-input-checks"
  run gpt.log 150 $B $L --impl plain --label plain
  run gpt.log 120 $B $L --label fast-layers
  run gpt.log 120 $B $L --sdpa default --label fast-sdpa-default
  run gpt.log 120 $B $L --ce plain --label fast-ce-plain
  run gpt.log 150 $B $L --compile none --label fast-eager
  run gpt.log 150 $B $L --gelu tanh --compile model --ce chunked --label fast-compile-model-tanh
  run gpt.log 150 $B $L --gelu tanh --compile model --ce chunked-grad-in-forward \
    --label fast-compile-model-tanh-ce-fwd-grad
}

t_gpt_profile() {  # kernel-time profiles by class of gigatron's best step and of the compiled anchor, both configs
  local c
  for c in gpt-1.3b gpt-125m; do
    run gpt.log 150 $B --config $c $BEST --label fast-compile-model-tanh-profiled \
      --profile "$OUT/profile-gigatron-$c.json" --sync-debug
    run anchors.log 120 python3 bench/gpt/compare_profile.py $c compile \
      "$OUT/profile-torch-compile-$c.json"
  done
}

t_gemm_shapes() {  # the layer GEMMs alone, Megatron's vs the anchor's init, beside both steps; SM clock / power sampled
  nvidia-smi --query-gpu=index,timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
    --format=csv,noheader -lms 250 >"$OUT/smi.csv" &
  local smi=$! c
  for c in gpt-1.3b gpt-125m; do
    run gemm.log 90 python3 bench/gpt/bench_gemm_shapes.py --config $c
    run gpt.log 120 $B --config $c $BEST --label fast-compile-model-tanh
    run gpt.log 100 $B --config $c $BEST --anchor-init --label fast-compile-model-tanh-anchor-init
    run anchors.log 100 python3 $A/torch_baseline_bench.py $c compile
  done
  kill "$smi"
}

t_adamw() {  # the AdamW step alone (torch fused, compiled flat / foreach, gigatron's training optimizers), both configs
  run adamw.log 150 python3 bench/optimizer/bench_adamw.py --config gpt-1.3b
  run adamw.log 120 python3 bench/optimizer/bench_adamw.py --config gpt-125m
}

t_optimizer_host() {  # [CPU] host time of the training optimizer's step pieces (torch step, then flat step)
  run optimizer-host.log 120 python3 bench/optimizer/bench_optimizer_host.py
  run optimizer-host.log 120 python3 bench/optimizer/bench_optimizer_host.py --flat
}

t_train() {  # pretrain_gpt at gpt-1.3b's shape: no dropout, torch Adam step, sync-free step, dropout 0.1, CUDA graphs
  train_one 150 nodrop $NODROP
  # the torch fused Adam step instead of the flat one (the default on CUDA)
  train_one 130 nodrop-torch-step $NODROP --no-flat-adam-step
  # no host sync in the step (opt-in)
  train_one 130 nodrop-sync-free $NODROP --sync-free-step
  train_one 130 dropout0.1 $DROP
  train_one 140 nodrop-cudagraphs $NODROP --torch-compile-mode reduce-overhead
}

t_train_profile() {  # pretrain_gpt profiled (light: no stacks) and its host syncs counted by call site
  train_one 200 nodrop-light-profile $NODROP $PROF \
    --tensorboard-dir /tmp/tb-profile --no-profile-stacks
  ENTRY="bench/tools/sync_debug_run.py -m gigatron.training.pretrain_gpt" \
    train_one 200 nodrop-sync-debug $NODROP
}

t_moe() {  # MoE fast path: gigatron mixtral-8l + deepseek-fg (fwd+bwd, host syncs counted) beside megatron-core's and the torch MoE anchor (eager, compile); MOE {json} summary
  local G="--optimizer none --no-input-checks --sync-debug" c
  for c in mixtral-8l deepseek-fg; do
    run moe.log 150 $B --config $c $G --label fast-moe-layers
    if tail -1 "$RES" | grep -q '"failed"'; then  # a graph break on this GPU: still measure
      run moe.log 150 $B --config $c $G --fullgraph off --label fast-moe-layers-breaks
    fi
  done
  _megatron_wheel
  run moe.log 100 torchrun --nproc-per-node 1 --master-port 29612 $A/megatron_moe_bench.py
  run moe.log 60 python3 $A/torch_moe_bench.py
  run moe.log 110 python3 $A/torch_moe_bench.py compile
  python3 bench/moe/compare_moe.py "$RES"
}

t_moe_ep2() {  # [2 GPUs] deepseek-fg (shared experts) at EP 2 x DP 2, forward + backward, without and with --moe-shared-expert-overlap
  local G="--optimizer none --no-input-checks"
  run moe.log 200 $T2 --config deepseek-fg --ep 2 $G --label fast-moe-ep2
  run moe.log 200 $T2 --config deepseek-fg --ep 2 $G --moe-shared-expert-overlap \
    --label fast-moe-ep2-shared-overlap
}

t_moe_more() {  # MoE: the torch anchor at deepseek-fg's expert shape (no shared experts), gigatron whole-model compile and SequentialMLP; MOE {json}
  sed -e 's/^L, H, A, KV, FFN, E, K, S, B, V = .*/L, H, A, KV, FFN, E, K, S, B, V = 8, 2048, 16, 16, 1024, 64, 8, 2048, 4, 50304/' \
    -e 's/"config": "moe-8x-h200"/"config": "deepseek-fg-no-shared"/' $A/torch_moe_bench.py >/tmp/torch_moe_fg.py
  run moe.log 60 python3 /tmp/torch_moe_fg.py
  run moe.log 130 python3 /tmp/torch_moe_fg.py compile
  local G="--optimizer none --no-input-checks"
  run moe.log 150 $B --config mixtral-8l $G --compile model --label fast-moe-model
  run moe.log 120 $B --config mixtral-8l $G --experts sequential --label fast-moe-sequential
  run moe.log 100 python3 bench/moe/bench_moe.py --config moe-8x-h200
  python3 bench/moe/compare_moe.py "$RES"
}

t_moe_profile() {  # MoE kernel profiles: gigatron mixtral-8l, whole model compiled, beside the compiled torch MoE anchor ($OUT/prof-moe-*.json; MOE_PROFILE_MORE=1 adds per-layer compile and two cross-entropy variants), then the CUDA host-sync test of the compiled MoE layers
  local G="--optimizer none --no-input-checks"
  run moe.log 180 $B --config mixtral-8l $G --compile model --profile "$OUT/prof-moe-model.json" --label fast-moe-model
  run moe.log 120 python3 bench/gpt/compare_profile.py moe compile "$OUT/prof-moe-anchor.json"
  if [ -n "${MOE_PROFILE_MORE:-}" ]; then
    run moe.log 150 $B --config mixtral-8l $G --profile "$OUT/prof-moe-layers.json" --label fast-moe-layers
    run moe.log 150 $B --config mixtral-8l $G --compile model --ce plain --label fast-moe-model-ce-plain
    run moe.log 150 $B --config mixtral-8l $G --compile model --ce chunked-grad-in-forward --label fast-moe-model-ce-grad-in-fwd
  fi
  run_tests 150 -m gpu -x --tb=long tests/core/transformer/moe/test_moe_compile.py
}

t_train_moe() {  # pretrain_gpt at mixtral-8l's shape: GroupedMLP, whole model compiled, fp32 main params (MFU by active parameters in the log)
  local S="--num-layers 8 --hidden-size 2048 --num-attention-heads 16 --group-query-attention \
    --num-query-groups 8 --ffn-hidden-size 4096 --seq-length 2048 --max-position-embeddings 2048 \
    --micro-batch-size 4 --global-batch-size 4 --vocab-size 50304 --train-iters 40 --log-interval 10 \
    --position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear \
    --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 4096 --moe-grouped-gemm \
    --moe-token-dispatcher-type alltoall --moe-aux-loss-coeff 1e-2"
  TRAIN_SHAPE="$S" train_one 300 moe-mixtral-8l $NODROP
}

_torchao_wheel() {  # torchao (the fp8 extra) from the carried wheel in .whl/
  if ls .whl/torchao-*.whl >/dev/null 2>&1 && ! python3 -c "import torchao" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site-ao .whl/torchao-*.whl && export PYTHONPATH=/tmp/site-ao${PYTHONPATH:+:$PYTHONPATH}
  fi
}

t_fp8() {  # FP8 (torchao tensorwise) vs bf16: gpt-1.3b beside the torchao-converted anchor, Llama-3-8B layers (reports/fp8.md)
  _torchao_wheel
  local L="--no-input-checks --compile layers --ce chunked"  # FP8 compiles per layer (report)
  run anchors.log 120 python3 $A/torch_baseline_bench.py gpt-1.3b compile
  run anchors.log 150 python3 $A/torch_baseline_bench.py gpt-1.3b compile tensorwise
  run gpt.log 120 $B --config gpt-1.3b $L --gelu tanh --label bf16-layers
  run gpt.log 150 $B --config gpt-1.3b $L --gelu tanh --fp8 tensorwise --label fp8-tensorwise-layers
  run gpt.log 150 $B --config llama3-8b-8l $L --label bf16-layers
  run gpt.log 180 $B --config llama3-8b-8l $L --fp8 tensorwise --label fp8-tensorwise-layers
}

t_fp8_model() {  # FP8 with the whole model compiled: gpt-1.3b beside the torchao-converted anchor and gigatron bf16 (reports/fp8.md)
  _torchao_wheel
  run anchors.log 150 python3 $A/torch_baseline_bench.py gpt-1.3b compile tensorwise
  run gpt.log 120 $B --config gpt-1.3b $BEST --label bf16-model
  run gpt.log 320 $B --config gpt-1.3b $BEST --fp8 tensorwise --label fp8-tensorwise-model
}

t_fp8_llama_model() {  # FP8 vs bf16 with the whole model compiled: Llama-3-8B layers (reports/fp8.md)
  _torchao_wheel
  local L="--no-input-checks --compile model --ce chunked"
  run gpt.log 150 $B --config llama3-8b-8l $L --label bf16-model
  run gpt.log 240 $B --config llama3-8b-8l $L --fp8 tensorwise --label fp8-tensorwise-model
}

t_fp8_llama_profile() {  # the CUDA FP8 linear tests, then kernel profiles of Llama-3-8B layers, whole model compiled, bf16 and FP8 tensorwise ($OUT/prof-llama-*.json)
  _torchao_wheel
  local L="--no-input-checks --compile model --ce chunked"
  run_tests 150 -m gpu tests/core/tensor_parallel/test_fp8_linear_cuda.py
  run gpt.log 150 $B --config llama3-8b-8l $L --profile "$OUT/prof-llama-bf16.json" --label bf16-model
  run gpt.log 200 $B --config llama3-8b-8l $L --fp8 tensorwise --profile "$OUT/prof-llama-fp8.json" --label fp8-tensorwise-model
}

t_fp8_convergence() {  # gpt-125m, 1,000 steps on a real corpus (.data, carried): bf16 vs FP8 tensorwise (reports/fp8-convergence.md)
  _torchao_wheel
  if [ ! -f .data/code_text_document.idx ]; then  # bench/tools/make_code_corpus.py, then preprocess
    echo '{"skipped": "fp8-convergence: no .data/code_text_document (bench/tools/make_code_corpus.py)"}' >>"$RES"
    return
  fi
  local S="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024
    --max-position-embeddings 1024 --micro-batch-size 16 --global-batch-size 16 --train-iters 1000
    --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 100 --weight-decay 0.1
    --clip-grad 1.0 --seed 1234 --data-path .data/code_text_document --split 98,2,0
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model .data/tok --log-interval 10
    --eval-interval 100 --eval-iters 20 --bf16 --use-distributed-optimizer
    --accumulate-allreduce-grads-in-fp32 --hidden-dropout 0 --attention-dropout 0
    --torch-compile model --cross-entropy-loss-fusion --no-progress-bar
    --data-cache-path /tmp/fp8c-cache"
  local mode lim
  for mode in bf16 fp8; do
    local extra=""
    [ "$mode" = fp8 ] && extra="--fp8-format hybrid --fp8-recipe tensorwise"
    lim=$(_left)
    [ "$lim" -gt 200 ] && lim=200
    # shellcheck disable=SC2086  (S and extra are lists of words)
    timeout "$lim" torchrun --nproc-per-node 1 --master-port 29931 -m gigatron.training.pretrain_gpt \
      $S $extra >"$OUT/conv-$mode.log" 2>&1
  done
  python3 bench/tools/fp8_convergence.py "$OUT/conv-bf16.log" "$OUT/conv-fp8.log" | sed -n 's/^RESULT //p' >>"$RES"
}

t_ckpt() {  # checkpoint save / load GB/s of gpt-1.3b, gigatron vs megatron-core dist_checkpointing (needs .whl)
  _megatron_wheel
  run ckpt.log 230 python3 bench/ckpt/bench_ckpt.py --config gpt-1.3b --device cuda --repeats 2 \
    --time-budget 160 --dir /tmp/ckpt-bench
}

t_cp1() {  # gpt-1.3b on one GPU at 32k and 131k tokens (CP = 1): activation memory, recompute
  local CP="torchrun --nproc-per-node 1 --master-port 29612 bench/parallel/bench_cp.py --device cuda"
  CP="$CP --level gpt --config gpt-1.3b --dtype bf16 --train --cp 1 --modes p2p"
  run cp.log 120 $CP --seq 32768 --warmup 1 --iters 1
  run cp.log 120 $CP --seq 32768 --recompute --warmup 1 --iters 1
  run cp.log 150 $CP --seq 131072 --recompute-layers 12 --warmup 0 --iters 1
}

t_data() {  # [CPU] index building and blending (gigatron NumPy vs megatron-core C++), preprocessing
  run data.log 500 python3 bench/data/bench_data.py --repeats 7
}

t_blend() {  # [CPU] blending indices, 2/3/10/100 datasets x 1M and 100M samples vs megatron-core's C++ (reports/data-blending.md)
  run blend.log 500 python3 bench/data/bench_blend.py --repeats 5
}

t_tests() {  # the gpu-marked tests on this GPU (the CUDA resume test included)
  run_tests 400 -m gpu tests -rf --timeout 300
}

t_dp2() {  # [2 GPUs] DP = 2 gpt-1.3b (flat-overlap AdamW, layer groups 2,22) against its one-GPU run
  CUDA_VISIBLE_DEVICES=0 run gpt.log 120 $B --config gpt-1.3b $BEST --label fast-compile-model-tanh
  run dp.log 150 $T2 --config gpt-1.3b $BEST $DP2 --label fast-dp2-model-groups2-22-tanh-flat-overlap
  run dp.log 120 $T2 --config gpt-1.3b $BEST ${DP2/flat-overlap/flat} \
    --label fast-dp2-model-groups2-22-tanh-flat-adamw
}

t_tp2() {  # [2 GPUs] TP = 2 + SP gpt-1.3b, whole model compiled, against its one-GPU run
  CUDA_VISIBLE_DEVICES=0 run gpt.log 120 $B --config gpt-1.3b $BEST --label fast-compile-model-tanh
  run tp.log 150 $T2 --config gpt-1.3b $BEST --tp 2 --sp --no-memory-reorder \
    --label fast-tp2-sp-model-tanh
}

t_tp2_overlap() {  # [2 GPUs] TP = 2 + SP with --tp-comm-overlap (one hardware queue, +- 16 SMs left to NCCL), profiled
  local M="--config gpt-1.3b $BEST --tp 2 --sp --no-memory-reorder --tp-comm-overlap"
  CUDA_DEVICE_MAX_CONNECTIONS=1 run tp.log 150 $T2 $M --label fast-tp2-sp-model-tp-overlap-cdmc1 \
    --profile "$OUT/profile-tp2-overlap-cdmc1.json"
  CUDA_DEVICE_MAX_CONNECTIONS=1 run tp.log 150 $T2 $M --sm-carveout 16 \
    --label fast-tp2-sp-model-tp-overlap-cdmc1-carveout16
}

t_tp_comm() {  # [2 GPUs] the SP all-gather / reduce-scatter alone and beside a GEMM: NCCL vs the copy engines
  run tp-comm.log 90 torchrun --nproc-per-node 2 --master-port 29661 bench/parallel/bench_tp_comm.py
  CUDA_DEVICE_MAX_CONNECTIONS=1 run tp-comm.log 60 torchrun --nproc-per-node 2 \
    --master-port 29662 bench/parallel/bench_tp_comm.py
}

t_cp2() {  # [2 GPUs] gpt-1.3b on one 131,072-token sequence split over two GPUs (CP = 2, every mode)
  run cp.log 200 torchrun --nproc-per-node 2 --master-port 29651 bench/parallel/bench_cp.py --device cuda \
    --level gpt --config gpt-1.3b --dtype bf16 --train --seq 131072 --recompute-layers 12 --cp 2 \
    --warmup 1 --iters 1
}

t_train_dp2() {  # [2 GPUs] pretrain_gpt on DP = 2 (global batch 8), with and without --overlap-param-gather
  NPROC=2 train_one 200 nodrop-dp2 $NODROP --global-batch-size 8 --overlap-grad-reduce \
    --overlap-param-gather
  NPROC=2 train_one 170 nodrop-dp2-no-param-overlap $NODROP --global-batch-size 8 \
    --overlap-grad-reduce
}

t_layouts() {  # [2 GPUs] PP / VPP / CP layouts of bench_gpt on two GPUs (the layouts test)
  run_tests 420 -m gpu tests/bench/gpt/test_bench_gpt_layouts.py -k two_gpus
}

t_calibrate() {  # the calibration table of `gigatron estimate` (GEMMs incl. gpt-1.3b/125m shapes, attention, bandwidth), $OUT/calibration.json
  local f1 f2
  f1=$(python3 bench/estimate/estimate_check.py --print-flags gpt-1.3b)
  f2=$(python3 bench/estimate/estimate_check.py --print-flags gpt-125m)
  run calibrate.log 240 python3 bench/estimate/calibrate.py --out "$OUT/calibration.json" \
    --trace-config "$f1" --trace-config "$f2"
}

t_estimate_check() {  # calibrate, then gpt-1.3b and gpt-125m: estimated vs measured (bench_gpt) step time and peak memory
  t_calibrate
  local c
  for c in gpt-1.3b gpt-125m; do
    run estimate.log 300 python3 bench/estimate/estimate_check.py --calibration "$OUT/calibration.json" \
      --configs $c --modes "${ESTIMATE_MODES:-eager,compiled}"
  done
  grep '"estimate-check"' "$RES"
}

t_estimate_train() {  # pretrain_gpt at gpt-1.3b's and mixtral-8l's shapes, eager: `gigatron estimate` (committed h200 table) vs measured peak memory and step time
  # ESTIMATE_TRAIN_ARGS="--modes eager,compiled" adds t_train's --torch-compile model (~+90 s
  # each); ESTIMATE_TRAIN_SHAPES="tiny tiny-moe" ESTIMATE_TRAIN_ARGS="--device cpu" is the CPU
  # check (live tensor bytes, ~25 s)
  local shape
  for shape in ${ESTIMATE_TRAIN_SHAPES:-gpt-1.3b mixtral-8l}; do
    # shellcheck disable=SC2086  (a list of words)
    run estimate.log 240 python3 bench/estimate/estimate_train_check.py --calibration h200 \
      --shape "$shape" ${ESTIMATE_TRAIN_ARGS:-}
  done
  grep '"estimate-train"' "$RES"
}

# ---- main --------------------------------------------------------------------------------

list() {
  sed -n 's/^t_\([a-z0-9_]*\)() {  # \(.*\)$/\1\t\2/p' bench/run.sh |
    awk -F'\t' '{gsub("_", "-", $1); printf "  %-15s %s\n", $1, $2}'
}

if [ $# -eq 0 ] || [ "$1" = list ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  echo "usage: bash bench/run.sh TARGET...   (results in \$OUT, default /tmp/bench-out)"
  list
  exit 0
fi
for target in "$@"; do
  fn="t_${target//-/_}"
  if ! declare -F "$fn" >/dev/null; then
    echo "unknown target: $target" >&2
    list >&2
    exit 2
  fi
done
nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm --format=csv,noheader \
  >"$OUT/gpu.log" 2>/dev/null
for target in "$@"; do
  echo "=== target $target ($(date -u +%T))"
  "t_${target//-/_}"
done
[ -s "$RES" ] && python3 bench/tools/compare.py "$RES" 2>/dev/null | tail -40
exit 0
