"""`gigatron generate` smoke test on a tiny model: save a TP = 2 checkpoint (GQA + RoPE +
SwiGLU, NullTokenizer), then `generate --load DIR --prompt ... --greedy` (model flags and
tokenizer read from the checkpoint) under TP = 2 gives the tokens the in-memory model gave,
and so does a one-process run (TP = 1, resharded), also from the checkpoint laid out as a
converted (release) one, which loads without a word of fine-tuning; PP > 1 is a clear error."""

import contextlib
import io

import pytest

from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


PROMPTS = ["1 2 3", "7 8"]
TRAIN = [
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
    "--group-query-attention", "--num-query-groups", "2", "--swiglu", "--normalization",
    "RMSNorm", "--position-embedding-type", "rope", "--seq-length", "16",
    "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data",
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "60",
    "--hidden-dropout", "0", "--attention-dropout", "0",
]  # fmt: skip
GENERATE = ["--prompt", PROMPTS[0], "--prompt", PROMPTS[1], "--max-new-tokens", "6", "--greedy"]


def _save_and_generate(ckpt_dir):
    from gigatron.core import parallel_state
    from gigatron.core.inference import generate
    from gigatron.tools import generate as tool
    from gigatron.training.checkpointing import save_checkpoint
    from gigatron.training.global_vars import destroy_global_vars, get_tokenizer
    from gigatron.training.initialize import initialize_megatron
    from gigatron.training.pretrain_gpt import model_provider
    from gigatron.training.training import get_model

    args = initialize_megatron(
        argv=[*TRAIN, "--tensor-model-parallel-size", "2", "--save", ckpt_dir]
    )
    model = get_model(model_provider, wrap_with_ddp=False)
    save_checkpoint(1, model, None, None, args=args)
    ref = generate(model[0].eval(), get_tokenizer(), PROMPTS, top_k=1, num_tokens_to_generate=6)
    parallel_state.destroy_model_parallel()
    destroy_global_vars()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        results = tool.run(["--load", ckpt_dir, *GENERATE])
    return [r.generated_tokens for r in ref], [r.generated_tokens for r in results], out.getvalue()


def _generate_one_process(ckpt_dir):
    from gigatron.tools import generate as tool

    with pytest.raises(ValueError, match="pipeline-model-parallel-size"):
        tool.run(["--load", ckpt_dir, *GENERATE, "--pipeline-model-parallel-size", "2"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        results = tool.run(["--load", ckpt_dir, *GENERATE])
    return [r.generated_tokens for r in results], out.getvalue()


def _as_release(ckpt_dir):
    """The layout `gigatron convert hf-to-gigatron` writes: `release/` and tracker 'release'."""
    import os

    from gigatron.core.dist_checkpointing.checkpoint_files import TRACKER_FNAME

    with open(os.path.join(ckpt_dir, TRACKER_FNAME)) as f:
        iteration = int(f.read().strip())
    os.rename(os.path.join(ckpt_dir, f"iter_{iteration:07d}"), os.path.join(ckpt_dir, "release"))
    with open(os.path.join(ckpt_dir, TRACKER_FNAME), "w") as f:
        f.write("release")


@pytest.mark.timeout(300)
def test_generate_cli_tp2_and_tp1_from_checkpoint(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    ranks = run_distributed(_save_and_generate, 2, args=(ckpt,), timeout=240)
    ref, got, printed = ranks[0]
    assert got == ref and ranks[1][1] == ref
    assert all(len(tokens) == 6 for tokens in ref)
    assert "----- prompt 1 (6 new tokens, stopped at token limit) -----" in printed
    assert "TP=2" in printed and ranks[1][2] == ""  # only rank 0 prints
    tokens_tp1, printed_tp1 = run_distributed(_generate_one_process, 1, args=(ckpt,))[0]
    assert tokens_tp1 == ref
    assert "TP=1" in printed_tp1
    assert "fine-tune" not in printed_tp1, printed_tp1
    # a converted (release) checkpoint: its weights, with no word of fine-tuning
    _as_release(ckpt)
    tokens_release, printed_release = run_distributed(_generate_one_process, 1, args=(ckpt,))[0]
    assert tokens_release == ref
    assert "release checkpoint" in printed_release, printed_release
    assert "fine-tune" not in printed_release and "--finetune" not in printed_release
