"""pretrain_t5.main at PP = 2 (Megatron's encoder/decoder split: encoder on stage 0, decoder and
LM head on stage 1, 1F1B over 2 microbatches) equals the one-rank run of the same flags: the
losses of 3 steps, the grad norms (clipping on: the decoder stage's embedding copies must count
once) and every final weight, fp32. Both stages' word and position embeddings end equal to the
one-rank tables only if finalize_model_grads summed their grads over the embedding and
position-embedding groups."""

import pytest
import torch

from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


ITERS = 3


def _args(tmp, extra):
    import os

    import torch.distributed as dist

    from tests.fixtures.bert_t5.corpus import write_corpus, write_hf_tokenizer

    prefix = f"{tmp}/tiny_text_sentence"
    if dist.get_rank() == 0:  # one writer; the other ranks wait for the files
        os.makedirs(tmp, exist_ok=True)
        write_corpus(prefix, num_documents=40)
        write_hf_tokenizer(f"{tmp}/tok")
    dist.barrier()
    return [
        "--num-layers", "2", "--encoder-num-layers", "2", "--decoder-num-layers", "2",
        "--hidden-size", "32", "--num-attention-heads", "4",
        "--encoder-seq-length", "32", "--decoder-seq-length", "16",
        "--max-position-embeddings", "32",
        "--micro-batch-size", "4", "--global-batch-size", "8",
        "--lr", "1e-3", "--clip-grad", "0.5",
        "--train-iters", str(ITERS), "--seed", "3",
        "--data-path", prefix, "--split", "100,0,0", "--data-cache-path", f"{tmp}/cache",
        "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", f"{tmp}/tok",
        "--make-vocab-size-divisible-by", "8",
        "--log-interval", "1000", "--eval-interval", "100000", "--eval-iters", "0",
        "--no-progress-bar", "--num-workers", "0",
        "--hidden-dropout", "0", "--attention-dropout", "0",
    ] + extra  # fmt: skip


def _train(tmp, extra):
    """(losses, grad norms, {param name: final weight}) of this rank."""
    from gigatron.training import pretrain_t5

    torch.set_num_threads(1)
    result = pretrain_t5.main(_args(tmp, extra))
    history = result["history"]
    weights = {
        name: p.detach().clone()
        for chunk in result["model"]
        for name, p in chunk.module.named_parameters()
    }
    return (
        [h["losses"].get("lm loss") for h in history],
        [h["grad_norm"] for h in history],
        weights,
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "flags",
    [
        [],  # tied word embeddings, learned absolute positions (both on both stages)
        # Untied: the two stages' word embeddings are still one table (encoder and decoder
        # embed with it); relative: each stage keeps its own stack's bias table.
        ["--untie-embeddings-and-output-weights", "--position-embedding-type", "relative"],
    ],
    ids=["tied-learned", "untied-relative"],
)
def test_t5_pp2_training_matches_one_rank(tmp_path, flags):
    ((ref_losses, ref_norms, ref_weights),) = run_distributed(
        _train, 1, args=(str(tmp_path / "ref"), flags), timeout=120
    )
    stages = run_distributed(
        _train, 2, args=(str(tmp_path / "pp"), flags + ["--pipeline-model-parallel-size", "2"]),
        timeout=120,
    )  # fmt: skip
    (enc_losses, enc_norms, enc_weights), (dec_losses, dec_norms, dec_weights) = stages
    assert len(ref_losses) == len(dec_losses) == ITERS
    loss_err = max(abs(a - b) for a, b in zip(dec_losses, ref_losses))
    norm_err = max(abs(a - b) for a, b in zip(dec_norms + enc_norms, ref_norms * 2))
    # Each stack lives whole on its stage; both stages hold the embeddings.
    assert not any(n.startswith(("decoder.", "lm_head.")) for n in enc_weights)
    assert not any(n.startswith("encoder.") for n in dec_weights)
    assert set(enc_weights) | set(dec_weights) == set(ref_weights)
    weight_err = 0.0
    for stage_weights in (enc_weights, dec_weights):
        for name, w in stage_weights.items():
            torch.testing.assert_close(w, ref_weights[name], rtol=0, atol=1e-6, msg=name)
            weight_err = max(weight_err, (w - ref_weights[name]).abs().max().item())
    print(f"loss err {loss_err:.2e}, grad-norm err {norm_err:.2e}, weight err {weight_err:.2e}")
    assert loss_err <= 1e-6 and norm_err <= 1e-6, (dec_losses, ref_losses, dec_norms, ref_norms)
    # Every step updated the weights (Adam moves each param with a grad by ~lr = 1e-3 >> 1e-6),
    # so a missing grad sum on either stage shows up in the weight comparison.
    assert all(n > 0 for n in ref_norms) and enc_losses == [None] * ITERS


@pytest.mark.timeout(120)
def test_t5_pp2_checkpoint_resume_matches_uninterrupted(tmp_path):
    """Save at step 2 at PP = 2 (the decoder stage's embeddings are non-main replicas), resume
    and take step 3: loss, grad norm and every weight equal the uninterrupted run, exactly."""
    pp = ["--pipeline-model-parallel-size", "2", "--lr-decay-iters", "3"]
    full = run_distributed(_train, 2, args=(str(tmp_path / "f"), pp), timeout=120)
    ckpt = str(tmp_path / "ckpt")
    run_distributed(  # stops after step 2 of the same 3-step run (same saved schedule)
        _train, 2, args=(str(tmp_path / "r"), pp + ["--exit-interval", "2", "--save", ckpt]),
        timeout=120,
    )  # fmt: skip
    resumed = run_distributed(_train, 2, args=(str(tmp_path / "r"), pp + ["--load", ckpt]))
    for (f_losses, f_norms, f_weights), (r_losses, r_norms, r_weights) in zip(full, resumed):
        assert r_losses == f_losses[-1:] and r_norms == f_norms[-1:]
        assert set(r_weights) == set(f_weights)
        for name, w in r_weights.items():
            torch.testing.assert_close(w, f_weights[name], rtol=0, atol=0, msg=name)


class _EmbeddingStage(torch.nn.Module):
    """A pipeline stage with its own learned position table (GPT/BERT layout:
    `embedding.position_embeddings`), reduced to what finalize_model_grads reads."""

    def __init__(self, pre_process: bool):
        super().__init__()
        self.pre_process = pre_process
        self.share_embeddings_and_output_weights = False
        self.embedding = torch.nn.Module()
        self.embedding.position_embeddings = torch.nn.Embedding(4, 3)
        self.other = torch.nn.Parameter(torch.zeros(2))

    def shared_embedding_or_output_weight(self):
        return None


def _finalize_body():
    from types import SimpleNamespace

    from gigatron.core import parallel_state as ps
    from gigatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )

    rank = torch.distributed.get_rank()

    def run(pre_process, **init):
        ps.initialize_model_parallel(pipeline_model_parallel_size=2, **init)
        stage = _EmbeddingStage(pre_process)
        ddp = DistributedDataParallel(SimpleNamespace(), DistributedDataParallelConfig(), stage)
        ddp.zero_grad_buffer()
        for p in stage.parameters():
            p.main_grad.fill_(rank + 1)
        try:
            finalize_model_grads([ddp])
            grads = {n: p.main_grad.flatten()[0].item() for n, p in stage.named_parameters()}
        except ValueError as e:
            grads = str(e)
        ps.destroy_model_parallel()
        return grads

    return {
        # Default position-embedding ranks: the first stage only, nothing is summed.
        "default": run(True),
        # Both stages hold position embeddings: their grads are summed (1 + 2).
        "both": run(True, get_position_embedding_ranks=lambda pp_ranks: list(pp_ranks)),
        # A listed stage that does not embed is a configuration error, not a silent skip.
        "bad": run(False, get_position_embedding_ranks=lambda pp_ranks: list(pp_ranks)),
    }


def test_position_embedding_grads_summed_over_their_group():
    first, last = run_distributed(_finalize_body, 2, timeout=60)
    pos, other = "embedding.position_embeddings.weight", "other"
    assert first["default"] == {pos: 1.0, other: 1.0}
    assert last["default"] == {pos: 2.0, other: 2.0}
    assert first["both"] == {pos: 3.0, other: 1.0}
    assert last["both"] == {pos: 3.0, other: 2.0}
    for stage in (first, last):
        assert "position-embedding group [0, 1]" in stage["bad"], stage["bad"]
        assert "pre_process is False" in stage["bad"], stage["bad"]


def test_pretrain_t5_split_rank_checks():
    from types import SimpleNamespace

    from gigatron.training.pretrain_t5 import _split_rank

    def args(pp, split=None, vp=None):
        return SimpleNamespace(
            pipeline_model_parallel_size=pp,
            pipeline_model_parallel_split_rank=split,
            virtual_pipeline_model_parallel_size=vp,
        )

    assert _split_rank(args(1)) is None
    assert _split_rank(args(2)) == 1 and _split_rank(args(2, 1)) == 1
    with pytest.raises(ValueError, match=r"pipeline_model_parallel_size \(4\)"):
        _split_rank(args(4, 2))
    with pytest.raises(ValueError, match=r"virtual_pipeline_model_parallel_size \(2\)"):
        _split_rank(args(2, vp=2))
    with pytest.raises(ValueError, match=r"pipeline_model_parallel_split_rank \(1\) needs"):
        _split_rank(args(1, 1))
