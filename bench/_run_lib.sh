# Shared by the bench/run_gpu_*.sh device scripts (sourced): environment, megatron-core wheel
# from .whl/ (carry it), and run(), which keeps each benchmark's RESULT line in $RES.
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
GIGATRON_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
export GIGATRON_COMMIT
START=$(date +%s)
END=$((START + ${BUDGET_S:-575}))  # the whole script ends before the device call's limit

# run LOG LIMIT_S CMD...: one benchmark; keep its RESULT line; never stop the script. The limit
# shrinks to what is left of the script's budget; a run with under 25 s left is skipped.
run() {
  local log=$1 limit=$2
  shift 2
  local left=$((END - $(date +%s)))
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

B="python3 bench/bench_gpt.py"
A=bench/anchors
NC="--no-input-checks"

# run_tests LIMIT_S PYTEST_ARGS...: one pytest run on the device, its output in $OUT/tests.log
# (the last lines echoed); never stops the script.
run_tests() {
  local limit=$1
  shift
  echo "=== pytest $* ($(date -u +%T))" >>"$OUT/tests.log"
  timeout "$limit" python3 -m pytest "$@" -q -p no:cacheprovider >>"$OUT/tests.log" 2>&1
  tail -3 "$OUT/tests.log"
}

# pretrain_gpt at gpt-1.3b's shape (TRAIN_SHAPE overrides it for a CPU dry run)
TRAIN_SHAPE=${TRAIN_SHAPE:-"--num-layers 24 --hidden-size 2048 --num-attention-heads 16 \
  --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 4 --global-batch-size 4 \
  --vocab-size 50304 --train-iters 50 --log-interval 10"}

train_one() {  # train_one GPU PORT LIMIT LABEL FLAGS...: pretrain_gpt on GPU (NPROC=2 GPU=0,1: DP = 2)
  local gpu=$1 port=$2 lim=$3 label=$4
  shift 4
  local log="$OUT/train-$label-gpu${gpu//,/}.log" entry=${ENTRY:--m gigatron.training.pretrain_gpt}
  local left=$((END - $(date +%s)))
  [ "$lim" -gt "$left" ] && lim=$left
  if [ "$lim" -lt 25 ]; then echo "{\"skipped\": \"train $label\"}" >>"$RES"; return; fi
  echo "=== train $label GPU $gpu $* ($(date -u +%T))" >>"$OUT/train.log"
  # shellcheck disable=SC2086  (TRAIN_SHAPE is a list of flags)
  CUDA_VISIBLE_DEVICES=$gpu timeout "$lim" \
    torchrun --nproc-per-node "${NPROC:-1}" --master-port "$port" $entry \
    $TRAIN_SHAPE --lr 1e-4 --min-lr 1e-5 --mock-data --bf16 --use-distributed-optimizer \
    --accumulate-allreduce-grads-in-fp32 --cross-entropy-loss-fusion --torch-compile model \
    --weight-decay 0.1 --eval-iters 0 --eval-interval 100000 --no-progress-bar \
    --hidden-dropout 0 --attention-dropout 0 "$@" >"$log" 2>&1
  grep -v "^W1\|warn" "$log" | tail -c 3000 >>"$OUT/train.log"
  { echo "=== $label GPU $gpu $*"; grep -A40 "^profile: " "$log"; } >>"$OUT/profiles.txt"
  { echo "=== $label GPU $gpu $*"; grep "sync-debug" "$log"; } >>"$OUT/syncs.txt"
  local line
  line=$(python3 bench/parse_train_log.py "$log" --label "$label" --gpus "${NPROC:-1}" | sed -n 's/^RESULT //p')
  if [ -n "$line" ]; then echo "$line" >>"$RES"; else
    echo "{\"failed\": \"train $label\", \"rc\": 1}" >>"$RES"; fi
}
