"""Megatron-LM's example recipes (examples/ at the 0.20 line), each flag set read from the script
and scaled down: hidden 64, 2-4 layers, seq 64, tiny experts, mock data (or the tiny generated
corpus for BERT / T5, which need one), <= 4 CPU ranks, every other flag kept. Each trains 3
iterations. Recipes still stopped by a flag another piece of work adds are xfail(strict=True),
the reason naming the flag, so they turn green when it lands."""

from __future__ import annotations

import json
import os

import pytest

from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank

EVAL_AND_LOG = ["--log-interval", "1", "--save-interval", "10000", "--eval-interval", "1000",
                "--eval-iters", "1", "--no-progress-bar", "--num-workers", "0"]  # fmt: skip


# T5's 99982,9,9 split leaves the tiny corpus no validation documents: no evaluation there
TINY_CORPUS = ["--eval-iters", "0"]


def _gpt2_files(tmp) -> list[str]:
    """A tiny GPT-2 BPE vocabulary (the 256 byte symbols, <|endoftext|>) and no merges."""
    import torch.distributed as dist

    from gigatron.training.tokenizer._tiktoken import _bytes_to_unicode

    if not dist.is_initialized() or dist.get_rank() == 0:  # one writer; the others wait
        vocab = {ch: i for i, ch in enumerate(_bytes_to_unicode().values())}
        vocab["<|endoftext|>"] = len(vocab)
        with open(f"{tmp}/vocab.json", "w") as f:
            json.dump(vocab, f)
        with open(f"{tmp}/merges.txt", "w") as f:
            f.write("#version: 0.2\n")
    if dist.is_initialized():
        dist.barrier()
    return ["--vocab-file", f"{tmp}/vocab.json", "--merge-file", f"{tmp}/merges.txt"]


def _gpt3(tmp):
    # examples/gpt3/train_gpt3_175b_distributed.sh: Megatron's validate_args refuses its
    # --global-batch-size beside --step-batch-size-schedule; the schedule is kept
    return [
        "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "64", "--max-position-embeddings", "64", "--attention-backend", "auto",
        "--micro-batch-size", "1", "--step-batch-size-schedule", "0:2 256:4",
        "--train-iters", "3", "--weight-decay", "0.1", "--adam-beta1", "0.9",
        "--adam-beta2", "0.95", "--init-method-std", "0.006", "--clip-grad", "1.0", "--fp16",
        "--lr", "6.0e-5", "--lr-decay-style", "cosine", "--min-lr", "6.0e-6",
        "--lr-warmup-fraction", ".001", "--lr-decay-iters", "3",
        "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
        "--mock-data", *_gpt2_files(tmp), "--split", "949,50,1",
        *EVAL_AND_LOG, "--save", f"{tmp}/ckpt", "--load", f"{tmp}/ckpt",
        "--tensorboard-dir", f"{tmp}/tb",
    ]  # fmt: skip


def _corpus(tmp) -> tuple[str, str]:
    """The tiny sentence corpus and its WordPiece vocab.txt (rank 0 writes, the others wait)."""
    import torch.distributed as dist

    from tests.fixtures.bert_t5.corpus import TinyWordPieceTokenizer, write_corpus

    prefix = f"{tmp}/tiny_text_sentence"
    if dist.get_rank() == 0:
        write_corpus(prefix, num_documents=1200)  # documents in a 1-in-1000 test split
        words = TinyWordPieceTokenizer().inv_vocab
        with open(f"{tmp}/vocab.txt", "w") as f:
            # the corpus's ids, then the [UNK] a BERT vocabulary needs
            f.write("\n".join([*(words[i] for i in range(len(words))), "[UNK]"]) + "\n")
    dist.barrier()
    return prefix, f"{tmp}/vocab.txt"


def _bert(tmp):
    # examples/bert/train_bert_340m_distributed.sh: --vocab-file without --tokenizer-type
    prefix, vocab = _corpus(tmp)
    return [
        "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "64", "--max-position-embeddings", "64", "--attention-backend", "auto",
        "--micro-batch-size", "4", "--global-batch-size", "8", "--train-iters", "3",
        "--weight-decay", "1e-2", "--clip-grad", "1.0", "--fp16", "--lr", "0.0001",
        "--lr-decay-iters", "3", "--lr-decay-style", "linear", "--min-lr", "1.0e-5",
        "--weight-decay", "1e-2", "--lr-warmup-fraction", ".01", "--clip-grad", "1.0",
        "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1",
        "--data-path", prefix, "--vocab-file", vocab, "--split", "949,50,1",
        "--data-cache-path", f"{tmp}/cache", *EVAL_AND_LOG,
        "--save", f"{tmp}/ckpt", "--load", f"{tmp}/ckpt", "--tensorboard-dir", f"{tmp}/tb",
    ]  # fmt: skip


def _t5(tmp):
    # examples/t5/train_t5_220m_distributed.sh
    prefix, vocab = _corpus(tmp)
    return [
        "--encoder-num-layers", "2", "--decoder-num-layers", "2", "--hidden-size", "64",
        "--num-attention-heads", "4", "--kv-channels", "16", "--ffn-hidden-size", "128",
        "--encoder-seq-length", "64", "--decoder-seq-length", "32",
        "--max-position-embeddings", "64", "--micro-batch-size", "4", "--global-batch-size", "8",
        "--lr", "0.0001", "--train-iters", "3", "--lr-decay-iters", "3",
        "--lr-decay-style", "linear", "--min-lr", "0.00001", "--weight-decay", "1e-2",
        "--lr-warmup-fraction", ".01", "--clip-grad", "1.0", "--bf16", "--vocab-extra-ids", "100",
        "--init-method-std", "0.015", "--transformer-impl", "transformer_engine",
        "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
        "--attention-backend", "auto", "--data-path", prefix, "--vocab-file", vocab,
        "--tokenizer-type", "BertWordPieceCase", "--split", "99982,9,9",
        "--data-cache-path", f"{tmp}/cache", *EVAL_AND_LOG, *TINY_CORPUS,
        "--distributed-backend", "gloo",
        "--save", f"{tmp}/ckpt", "--load", f"{tmp}/ckpt", "--tensorboard-dir", f"{tmp}/tb",
    ]  # fmt: skip


def _mixtral(tmp):
    # examples/mixtral/train_mixtral_8x7b_distributed.sh (PP 4 x EP 8 -> PP 2 x EP 2); the
    # Llama2Tokenizer model file -> mock data with NullTokenizer
    return [
        "--use-mcore-models", "--disable-bias-linear", "--seq-length", "64",
        "--max-position-embeddings", "256", "--num-layers", "2", "--hidden-size", "64",
        "--ffn-hidden-size", "128", "--num-attention-heads", "4", "--init-method-std", "0.01",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--normalization", "RMSNorm",
        "--position-embedding-type", "rope", "--swiglu", "--untie-embeddings-and-output-weights",
        "--group-query-attention", "--num-query-groups", "2", "--no-masked-softmax-fusion",
        "--no-position-embedding", "--rotary-base", "1000000",
        "--num-experts", "4", "--moe-router-topk", "2", "--moe-router-load-balancing-type",
        "aux_loss", "--moe-aux-loss-coeff", "1e-2", "--moe-grouped-gemm",
        "--moe-token-dispatcher-type", "alltoall", "--overlap-param-gather",
        "--overlap-grad-reduce",
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
        "--split", "99990,8,2",
        "--micro-batch-size", "1", "--global-batch-size", "4", "--lr", "1e-4",
        "--train-iters", "3", "--lr-decay-iters", "3", "--lr-decay-style", "cosine",
        "--min-lr", "1.0e-5", "--weight-decay", "0.1", "--lr-warmup-iters", "1",
        "--clip-grad", "1.0", "--bf16",
        "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "2",
        "--expert-model-parallel-size", "2", "--use-distributed-optimizer",
        "--sequence-parallel", *EVAL_AND_LOG, "--save", f"{tmp}/ckpt", "--load", f"{tmp}/ckpt",
        "--tensorboard-dir", f"{tmp}/tb", "--no-load-optim", "--no-load-rng",
    ]  # fmt: skip


def _llama3_fp8(tmp):
    # examples/llama/train_llama3_8b_h100_fp8.sh (DTYPE=fp8, MOCK data), TP 2 x CP 1 on 2 ranks
    return [
        "--use-mcore-models", "--num-layers", "2", "--hidden-size", "64",
        "--ffn-hidden-size", "128", "--num-attention-heads", "4", "--group-query-attention",
        "--num-query-groups", "2", "--kv-channels", "16", "--seq-length", "64",
        "--max-position-embeddings", "64", "--position-embedding-type", "rope",
        "--rotary-base", "1000000", "--rotary-percent", "1.0", "--attention-dropout", "0.0",
        "--hidden-dropout", "0.0", "--swiglu", "--normalization", "RMSNorm",
        "--init-method-std", "0.0134", "--attention-backend", "fused", "--apply-layernorm-1p",
        "--untie-embeddings-and-output-weights", "--disable-bias-linear",
        "--micro-batch-size", "1", "--global-batch-size", "2", "--train-samples", "6",
        "--lr-decay-samples", "6", "--lr-warmup-samples", "2", "--lr", "0.00015",
        "--min-lr", "0.00001", "--decoupled-lr", "5.0e-4", "--decoupled-min-lr", "4.5e-5",
        "--lr-decay-style", "cosine", "--clip-grad", "1.0", "--weight-decay", "0.1",
        "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--bf16", "--grad-reduce-in-bf16",
        "--cross-entropy-loss-fusion", "--calculate-per-token-loss", "--manual-gc",
        "--empty-unused-memory-level", "1", "--exit-duration-in-mins", "235",
        "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
        "--fp8-format", "hybrid", "--fp8-amax-history-len", "1024",
        "--fp8-amax-compute-algo", "max", "--fp8-param-gather",
        "--tensor-model-parallel-size", "2", "--context-parallel-size", "1", "--sequence-parallel",
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
        "--data-cache-path", f"{tmp}/cache", "--tiktoken-pattern", "v2", "--split", "99,1,0",
        "--no-create-attention-mask-in-dataloader", "--no-mmap-bin-files", "--num-workers", "0",
        "--log-interval", "1", "--eval-iters", "1", "--eval-interval", "100",
        "--save-interval", "1000", "--log-throughput", "--ckpt-format", "torch_dist",
        "--distributed-timeout-minutes", "60", "--save", f"{tmp}/ckpt", "--load", f"{tmp}/ckpt",
        "--tensorboard-dir", f"{tmp}/tb", "--no-progress-bar",
    ]  # fmt: skip


def _gptoss(tmp):
    # examples/gptoss/02_train.sh (DTYPE=fp8, MOCK data), PP 2 on 2 ranks
    return [
        "--no-masked-softmax-fusion", "--transformer-impl", "transformer_engine",
        "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--no-rope-fusion",
        "--normalization", "RMSNorm", "--num-layers", "4", "--hidden-size", "64",
        "--ffn-hidden-size", "128", "--num-attention-heads", "8", "--group-query-attention",
        "--num-query-groups", "2", "--seq-length", "64", "--max-position-embeddings", "64",
        "--use-mcore-models", "--rotary-percent", "1.0", "--rope-type", "rope",
        "--position-embedding-type", "rope", "--rotary-base", "10000", "--no-bias-gelu-fusion",
        "--export-force-local-attention", "--no-bias-dropout-fusion", "--quick-geglu",
        "--glu-linear-offset", "1.0", "--softmax-type", "learnable", "--window-attn-skip-freq",
        "2", "--activation-func-clamp-value", "7.0", "--window-size", "15,0", "--enable-gpt-oss",
        "--num-experts", "4", "--moe-router-topk", "2", "--moe-router-load-balancing-type",
        "aux_loss", "--moe-aux-loss-coeff", "1e-3", "--moe-grouped-gemm",
        "--moe-token-dispatcher-type", "alltoall", "--overlap-param-gather",
        "--overlap-grad-reduce", "--moe-ffn-hidden-size", "128", "--moe-router-dtype", "fp32",
        "--moe-z-loss-coeff", "1e-3", "--moe-permute-fusion",
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
        "--data-cache-path", f"{tmp}/cache", "--tiktoken-pattern", "v2", "--split", "99,1,0",
        "--no-create-attention-mask-in-dataloader", "--no-mmap-bin-files", "--num-workers", "0",
        "--micro-batch-size", "1", "--global-batch-size", "2", "--lr", "1.0e-5",
        "--train-samples", "6", "--lr-decay-samples", "6", "--lr-decay-style", "cosine",
        "--min-lr", "1.0e-6", "--weight-decay", "0.1", "--lr-warmup-fraction", "0.05",
        "--clip-grad", "1.0", "--bf16", "--use-flash-attn", "--attention-softmax-in-fp32",
        "--accumulate-allreduce-grads-in-fp32", "--disable-bf16-reduced-precision-matmul",
        "--recompute-activations", "--tensor-model-parallel-size", "1",
        "--pipeline-model-parallel-size", "2", "--expert-model-parallel-size", "1",
        "--sequence-parallel", "--context-parallel-size", "1", "--use-distributed-optimizer",
        "--fp8-format", "hybrid", "--fp8-param-gather", "--fp8-amax-compute-algo", "max",
        "--fp8-amax-history-len", "1024", "--log-interval", "1", "--save-interval", "10000",
        "--eval-interval", "50000000", "--eval-iters", "0", "--save", f"{tmp}/ckpt",
        "--tensorboard-dir", f"{tmp}/tb", "--moe-per-layer-logging", "--no-load-optim",
        "--no-load-rng", "--log-throughput", "--no-progress-bar",
    ]  # fmt: skip


def _deepseek_v3(tmp):
    # examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh with USE_MEGATRON_FSDP=0 (TP 2 x EP 2)
    return [
        "--distributed-timeout-minutes", "60", "--tensor-model-parallel-size", "2",
        "--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "1",
        "--context-parallel-size", "1", "--use-distributed-optimizer", "--overlap-grad-reduce",
        "--overlap-param-gather", "--use-mcore-models", "--sequence-parallel", "--use-flash-attn",
        "--disable-bias-linear", "--micro-batch-size", "1", "--global-batch-size", "4",
        "--train-samples", "12", "--exit-duration-in-mins", "220",
        "--no-check-for-nan-in-loss-and-grad", "--manual-gc", "--manual-gc-interval", "10",
        "--recompute-granularity", "selective", "--recompute-modules", "mlp", "moe",
        "mla_up_proj", "layernorm", "--transformer-impl", "transformer_engine",
        "--seq-length", "64", "--data-cache-path", f"{tmp}/cache",
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
        "--split", "99,1,0", "--no-mmap-bin-files", "--no-create-attention-mask-in-dataloader",
        "--num-workers", "0", "--num-layers", "4", "--hidden-size", "64",
        "--ffn-hidden-size", "128", "--num-attention-heads", "4", "--kv-channels", "16",
        "--max-position-embeddings", "64", "--position-embedding-type", "rope",
        "--rotary-base", "10000", "--make-vocab-size-divisible-by", "32",
        "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--swiglu",
        "--untie-embeddings-and-output-weights", "--multi-latent-attention",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--clip-grad", "1.0",
        "--weight-decay", "0.1", "--qk-layernorm", "--lr-decay-samples", "12",
        "--lr-warmup-samples", "4", "--lr-warmup-init", "3.9e-7", "--lr", "3.9e-6",
        "--min-lr", "3.9e-7", "--lr-decay-style", "cosine", "--adam-beta1", "0.9",
        "--adam-beta2", "0.95", "--num-experts", "8", "--moe-layer-freq", "[0]*1+[1]*3",
        "--moe-ffn-hidden-size", "32", "--moe-shared-expert-intermediate-size", "32",
        "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-router-topk", "4",
        "--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep",
        "--moe-router-pre-softmax", "--moe-grouped-gemm", "--moe-aux-loss-coeff", "1e-4",
        "--moe-router-group-topk", "2", "--moe-router-num-groups", "4",
        "--moe-router-topk-scaling-factor", "2.5", "--moe-router-score-function", "sigmoid",
        "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "1e-3",
        "--moe-router-dtype", "fp32", "--moe-permute-fusion", "--moe-router-force-load-balancing",
        "--q-lora-rank", "32", "--kv-lora-rank", "16", "--qk-head-dim", "16",
        "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16", "--rotary-scaling-factor", "40",
        "--mscale", "1.0", "--mscale-all-dim", "1.0", "--mtp-num-layers", "1",
        "--mtp-loss-scaling-factor", "0.1", "--eval-iters", "1", "--eval-interval", "100",
        "--auto-detect-ckpt-format", "--load", f"{tmp}/ckpt", "--save", f"{tmp}/ckpt",
        "--save-interval", "100", "--dist-ckpt-strictness", "log_all", "--init-method-std",
        "0.02", "--log-timers-to-tensorboard", "--log-memory-to-tensorboard",
        "--log-num-zeros-in-grad", "--log-params-norm", "--log-validation-ppl-to-tensorboard",
        "--log-throughput", "--log-interval", "1", "--logging-level", "40",
        "--tensorboard-dir", f"{tmp}/tb", "--bf16", "--enable-experimental", "--no-progress-bar",
    ]  # fmt: skip


def _run(entry, build, tmp):
    """Iterations run and the last loss of one recipe run on this rank's process."""
    import importlib
    import math

    import torch

    from tests.training._gpt_runs import reset_globals

    torch.set_num_threads(1)
    os.makedirs(tmp, exist_ok=True)
    reset_globals()
    result = importlib.import_module(f"gigatron.training.{entry}").main(build(tmp))
    if isinstance(result, int):  # pretrain_gpt.main returns its exit code
        from gigatron.training.global_vars import get_args

        return get_args().iteration, None
    losses = [v for h in result["history"] for v in h["losses"].values()]
    assert all(math.isfinite(v) for v in losses)
    return result["iteration"], losses[-1] if losses else None


@pytest.mark.parametrize(
    "entry, build, ranks",
    [
        ("pretrain_gpt", _gpt3, 4),
        ("pretrain_bert", _bert, 2),
        ("pretrain_t5", _t5, 1),
        ("pretrain_gpt", _mixtral, 4),  # overlapped param gather: params synced before a save
        pytest.param(
            "pretrain_gpt",
            _llama3_fp8,
            2,
            marks=pytest.mark.xfail(
                strict=True,
                reason="--fp8-param-gather (FP8 parameters gathered in FP8) is not implemented",
            ),
        ),
        pytest.param(
            "pretrain_gpt",
            _gptoss,
            2,
            marks=pytest.mark.xfail(
                strict=True,
                reason="--fp8-param-gather (FP8 parameters gathered in FP8) is not implemented",
            ),
        ),
        ("pretrain_gpt", _deepseek_v3, 4),
    ],  # fmt: skip
    ids=[
        "gpt3_175b",
        "bert_340m",
        "t5_220m",
        "mixtral_8x7b",
        "llama3_8b_fp8",
        "gptoss",
        "deepseek_v3",
    ],
)
def test_recipe_trains_three_iterations(tmp_path, entry, build, ranks):
    out = run_distributed(_run, ranks, args=(entry, build, str(tmp_path)), timeout=600)
    assert all(iteration == 3 for iteration, _ in out), out


def test_gpt3_recipe_as_written_is_refused_as_megatron_refuses_it(tmp_path):
    from gigatron.training.arguments import parse_args, validate_args

    os.makedirs(tmp_path / "t", exist_ok=True)
    argv = _gpt3(str(tmp_path / "t")) + ["--global-batch-size", "1536"]
    with pytest.raises(ValueError, match="both --step-batch-size-schedule and --global-batch"):
        validate_args(parse_args(argv=argv), 4)
