"""pretrain_gpt with --dataloader-inter-document-masking (packed sequences through
PackedSeqParams, micro-batches of 2 flattened into one row) trains exactly as with Megatron's
older per-document flags --reset-attention-mask --reset-position-ids (a [b, 1, s, s] mask), on a
corpus of short EOD-terminated documents; without either the losses differ."""

import numpy
import torch

from gigatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
from tests._one_rank import one_rank_fixtures
from tests.training._gpt_runs import ARGS, reset_globals, run_pretrain_gpt

gloo_world, single_rank = one_rank_fixtures()


def _runs(tmp):
    prefix = f"{tmp}/docs"
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    rng = numpy.random.default_rng(0)
    for _ in range(60):
        doc = rng.integers(1, 90, size=int(rng.integers(2, 9))).tolist() + [100]  # 100: EOD
        builder.add_document(torch.tensor(doc), [len(doc)])
    builder.finalize(prefix + ".idx")
    data = ["--data-path", prefix, "--data-cache-path", f"{tmp}/cache", "--split", "1,0,0"]
    data += ["--tokenizer-type", "NullTokenizer", "--train-iters", "2", "--eval-iters", "0"]
    data += ["--seed", "5"]
    out = {}
    for name, flags in {
        "packed": ["--dataloader-inter-document-masking"],
        "mask": ["--reset-attention-mask", "--reset-position-ids"],
        "plain": [],
    }.items():
        result = run_pretrain_gpt([a for a in ARGS if a != "--mock-data"] + data + flags)
        out[name] = [h["losses"]["lm loss"] for h in result["history"]]
    reset_globals()
    return out


def test_packed_pretraining_matches_the_reset_attention_mask(tmp_path):
    out = _runs(str(tmp_path))
    assert len(out["packed"]) == 2
    for a, b in zip(out["packed"], out["mask"], strict=True):
        assert abs(a - b) <= 1e-5 * abs(b), out
    assert abs(out["plain"][0] - out["mask"][0]) > 1e-3, out  # the documents matter
