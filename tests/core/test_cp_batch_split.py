"""get_batch_on_this_cp_rank: chunks r and 2·cp−1−r of every sequence, on live CP groups."""

import pytest
import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.core.utils import get_batch_on_this_cp_rank
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


def _split(cp):
    ps.initialize_model_parallel(context_parallel_size=cp)
    s = 4 * cp
    tokens = torch.arange(2 * s).view(2, s)
    mask = torch.zeros(2, 1, s, s, dtype=torch.bool)
    mask[:, :, :, 0] = True
    out = get_batch_on_this_cp_rank({"tokens": tokens, "attention_mask": mask, "max_seqlen": 7})
    r = dist.get_rank()
    chunk = s // (2 * cp)
    expect = torch.cat(
        [
            tokens[:, r * chunk : (r + 1) * chunk],
            tokens[:, (2 * cp - 1 - r) * chunk : (2 * cp - r) * chunk],
        ],
        dim=1,
    )
    assert torch.equal(out["tokens"], expect)
    assert out["attention_mask"].shape == (2, 1, 2 * chunk, s)
    assert out["max_seqlen"] == 7
    gathered = [torch.empty_like(out["tokens"]) for _ in range(cp)]
    dist.all_gather(gathered, out["tokens"])
    assert sorted(torch.cat(gathered, dim=1)[0].tolist()) == tokens[0].tolist()


def test_cp2_and_cp4():
    run_distributed(_split, 2, args=(2,))
    run_distributed(_split, 4, args=(4,))
