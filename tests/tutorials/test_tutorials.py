"""The tutorial programs of docs/learn.md (examples/tutorials/*.py), written against
`megatron.core`, run unchanged through `python -m gigatron.compat.megatron` on CPU ranks.

- the simple training loop at TP 2 (saving a distributed checkpoint), PP 2 (the same losses and
  grad norms as TP 2 from the same initial weights) and PP 2 and TP 2 x PP 2 loading it (the
  reloaded model's loss equals the saved one's at the other layout);
- a hand-built context-parallel model: CP 2 gives the loss of the whole sequence on one rank;
- MoE with expert parallelism 2: each rank holds 2 of the 4 experts;
- BERT and T5 from a preprocessed corpus with Megatron's BertWordPieceLowerCase tokenizer.
"""

from __future__ import annotations

import re

import pytest

from tests.tutorials.conftest import TUTORIALS, launch

pytestmark = pytest.mark.multirank


GPT = f"{TUTORIALS}/gpt_train_loop.py"


def _floats(pattern: str, out: str) -> list[float]:
    return [float(x) for x in re.findall(pattern, out)]


@pytest.fixture(scope="module")
def tp2_checkpoint(tmp_path_factory):
    """(directory, eval loss after saving, output) of the TP 2 run that saves."""
    ckpt = tmp_path_factory.mktemp("gpt") / "ckpt"
    out = launch(2, GPT, "--tp", "2", "--save", str(ckpt))
    (saved,) = _floats(r"saved \S+: eval loss ([0-9.]+)", out)
    return str(ckpt), saved, out


@pytest.mark.timeout(180)
def test_gpt_train_loop_tensor_parallel_saves(tp2_checkpoint):
    ckpt, _, out = tp2_checkpoint
    assert "tp rank 1, pp rank 0, layers [1, 2]" in out, out
    losses = _floats(r"step \d: loss ([0-9.]+)", out)
    assert len(losses) == 4 and losses[-1] < losses[0], losses


@pytest.mark.timeout(180)
def test_gpt_train_loop_pipeline_parallel_trains_as_tensor_parallel(tp2_checkpoint):
    """docs/learn.md: every layout starts from the same weights and computes the same losses
    (layer 2 and the output layer of stage 1 are drawn as at PP 1; no dropout)."""
    _, _, tp2_out = tp2_checkpoint
    out = launch(2, GPT, "--pp", "2")
    pattern = r"step \d: loss ([0-9.]+) grad norm ([0-9.]+)"
    tp2 = [tuple(map(float, m)) for m in re.findall(pattern, tp2_out)]
    pp2 = [tuple(map(float, m)) for m in re.findall(pattern, out)]
    assert len(pp2) == len(tp2) == 4, (tp2, pp2)
    for (loss_tp, norm_tp), (loss_pp, norm_pp) in zip(tp2, pp2):
        assert loss_pp == pytest.approx(loss_tp, abs=2e-6), (tp2, pp2)
        assert norm_pp == pytest.approx(norm_tp, abs=2e-6), (tp2, pp2)


@pytest.mark.timeout(180)
def test_gpt_train_loop_pipeline_parallel_loads_the_tp2_checkpoint(tp2_checkpoint):
    ckpt, saved, _ = tp2_checkpoint
    out = launch(2, GPT, "--pp", "2", "--load", ckpt)
    assert "pp rank 0, layers [1]" in out and "pp rank 1, layers [2]" in out, out
    (loaded,) = _floats(r"loaded \S+: eval loss ([0-9.]+)", out)
    assert loaded == pytest.approx(saved, abs=1e-5)
    losses = _floats(r"step \d: loss ([0-9.]+)", out)
    assert len(losses) == 4 and all(0 < x < 5 for x in losses), losses


@pytest.mark.timeout(240)
def test_gpt_train_loop_tp2_x_pp2_loads_the_tp2_checkpoint(tp2_checkpoint):
    ckpt, saved, _ = tp2_checkpoint
    out = launch(4, GPT, "--tp", "2", "--pp", "2", "--load", ckpt, "--steps", "2", timeout=220)
    assert "tp rank 1, pp rank 1, layers [2]" in out, out
    (loaded,) = _floats(r"loaded \S+: eval loss ([0-9.]+)", out)
    assert loaded == pytest.approx(saved, abs=1e-5)
    assert len(_floats(r"step \d: loss ([0-9.]+)", out)) == 2, out


@pytest.mark.timeout(150)
def test_context_parallel_gives_the_loss_of_the_whole_sequence():
    out = launch(2, f"{TUTORIALS}/context_parallel.py")
    (full,) = _floats(r"loss without context parallel: ([0-9.]+)", out)
    (cp,) = _floats(r"loss with context parallel 2: ([0-9.]+)", out)
    assert cp == pytest.approx(full, abs=1e-5)
    losses = _floats(r"step \d: loss ([0-9.]+)", out)
    assert len(losses) == 4 and losses[-1] < losses[0], losses


@pytest.mark.timeout(150)
def test_moe_expert_parallel_splits_the_experts():
    out = launch(2, f"{TUTORIALS}/moe_expert_parallel.py")
    for rank in (0, 1):
        assert f"expert-parallel rank {rank}, 2 of 4 experts per layer" in out, out
    losses = _floats(r"step \d: loss ([0-9.]+)", out)
    assert len(losses) == 4 and losses[-1] < losses[0], losses


@pytest.mark.timeout(150)
def test_bert_and_t5_from_a_preprocessed_corpus(wordpiece_corpus):
    prefix, vocab = wordpiece_corpus
    script = f"{TUTORIALS}/bert_t5_pretraining.py"
    out = launch(0, script, "--data-prefix", prefix, "--vocab-file", vocab, "--steps", "8")
    bert = _floats(r"bert step \d: lm loss ([0-9.]+)", out)
    sop = _floats(r"sop loss ([0-9.]+)", out)
    t5 = _floats(r"t5 step \d: lm loss ([0-9.]+)", out)
    assert len(bert) == len(sop) == len(t5) == 8, out
    assert bert[-1] < bert[0] - 0.3 and t5[-1] < t5[0] - 0.3, (bert, t5)
    assert all(0.3 < x < 1.5 for x in sop), sop  # the binary head's 2-way cross entropy
