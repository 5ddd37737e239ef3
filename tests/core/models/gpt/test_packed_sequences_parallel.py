"""Packed sequences under TP = 2 (+ SP) and CP = 2 on two gloo ranks (one spawned run): the
per-document losses and every gradient of a packed row equal the documents run one by one,
unpacked, on one rank (fp32, 1e-6). CP = 2 splits every document into 4 chunks (rank r keeps
chunks r and 3 - r, get_batch_on_this_cp_rank), once with lengths divisible by 4 and once with
documents padded to them (cu_seqlens_q_padded, split and described by megatron-core's
get_thd_batch_on_this_cp_rank; padding tokens carry no loss)."""

import pytest
import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.core import tensor_parallel
from gigatron.core.models.common.tp_state_dict import shard_for_rank
from gigatron.core.utils import get_batch_on_this_cp_rank, get_thd_batch_on_this_cp_rank
from gigatron.testing import run_distributed
from tests.core.models.gpt import _parity as parity
from tests.core.models.gpt.test_packed_sequences import (
    build,
    cp_token_index,
    make_batch,
    packed_params,
    run_packed,
    run_unpacked,
)

pytestmark = pytest.mark.multirank

DOCS = (4, 8, 4)
REAL = (3, 7, 4)  # padded to DOCS


def _layout(tp=1, cp=1):
    ps.destroy_model_parallel()
    ps.initialize_model_parallel(tp, context_parallel_size=cp)
    tensor_parallel.model_parallel_cuda_manual_seed(1)


def _reference(docs):
    torch.manual_seed(0)
    model = build()
    batch = make_batch(docs)
    loss = run_unpacked(model, batch)
    return (loss, *parity.weights_and_grads(model))


def _padded_batch():
    """make_batch(DOCS) with document i's real tokens REAL[i] first, then padding (weight 0);
    and the real documents alone, laid out unpadded (the reference's input)."""
    batch = make_batch(DOCS)
    keep = torch.cat([torch.arange(a, a + n) for a, n in zip((0, 4, 12), REAL)])
    real = {k: v[:, keep] for k, v in batch.items() if k != "cu_seqlens"}
    real["position_ids"] = torch.cat([torch.arange(n) for n in REAL])[None]
    real["cu_seqlens"] = torch.tensor([0, 3, 10, 14], dtype=torch.int32)
    weights = torch.zeros_like(batch["weights"])
    weights[:, keep] = real["weights"]
    return dict(batch, weights=weights), real, keep


def _compare(loss, expected_loss, params, ref_grads, tp, group=None, sp_group=None):
    torch.testing.assert_close(loss, expected_loss, rtol=0, atol=1e-6)
    worst = (loss - expected_loss).abs().max().item()
    tp_rank = ps.get_tensor_model_parallel_rank()
    for name, p in params.items():
        grad = p.grad.clone()
        if group is not None:  # each CP rank's grads cover its tokens: sum them
            dist.all_reduce(grad, group=group)
        if sp_group is not None and getattr(p, "sequence_parallel", False):
            dist.all_reduce(grad, group=sp_group)  # finalize_model_grads' SP rule
        expected = shard_for_rank(ref_grads[name], p, tp_rank, tp)
        torch.testing.assert_close(grad, expected, rtol=0, atol=1e-6, msg=name)
        worst = max(worst, (grad - expected).abs().max().item())
    return worst


def _cp_run(full, batch, packed=None, padded_bounds=None):
    """CP = 2 model from the full weights on this rank's per-document chunks of `batch`: split
    by get_batch_on_this_cp_rank (with `packed`), or, with `padded_bounds`, by
    get_thd_batch_on_this_cp_rank, which also builds the PackedSeqParams (megatron-core's)."""
    model = build(cp=2)
    params = parity.load_shards(model, full, 0, 1)
    split = {k: batch[k] for k in ("tokens", "labels", "position_ids")}
    split["loss_mask"] = batch["weights"]  # a key get_batch_on_this_cp_rank cuts
    if padded_bounds is None:
        split["cu_seqlens"] = batch["cu_seqlens"][None]
        local = get_batch_on_this_cp_rank(split)
    else:
        max_seqlen = torch.tensor([int(batch["cu_seqlens"].diff().max())])
        local, packed = get_thd_batch_on_this_cp_rank(
            split, batch["cu_seqlens"], padded_bounds, max_seqlen
        )
    local["weights"] = local.pop("loss_mask")
    return run_packed(model, local, packed), params


def _body():
    torch.set_num_threads(1)
    _layout()
    ref_loss, full, ref_grads = _reference(DOCS)
    padded, real, keep = _padded_batch()
    torch.manual_seed(0)
    ref_model = build()
    pad_ref_loss = run_unpacked(ref_model, real)
    _, pad_ref_grads = parity.weights_and_grads(ref_model)
    batch, cu = make_batch(DOCS), make_batch(DOCS)["cu_seqlens"]
    errors = {}

    _layout(tp=2)  # TP = 2 with sequence parallelism
    model = build(tp=2, sp=True)
    params = parity.load_shards(model, full, ps.get_tensor_model_parallel_rank(), 2)
    loss = run_packed(model, batch, packed_params(cu))
    sp_group = ps.get_tensor_model_parallel_group()
    errors["tp2"] = _compare(loss, ref_loss, params, ref_grads, 2, sp_group=sp_group)

    _layout(cp=2)
    rank, cp_group = ps.get_context_parallel_rank(), ps.get_context_parallel_group()
    loss, params = _cp_run(full, batch, packed_params(cu))
    index = cp_token_index(cu, 2, rank)
    errors["cp2"] = _compare(loss, ref_loss[:, index], params, ref_grads, 1, group=cp_group)

    padded["cu_seqlens"] = real["cu_seqlens"]  # real lengths; the row is laid out by `cu`
    loss, params = _cp_run(full, padded, padded_bounds=cu)
    index = cp_token_index(cu, 2, rank)
    is_real = torch.isin(index, keep)  # compare real tokens only; padding carries no loss
    real_pos = torch.searchsorted(keep, index[is_real])
    errors["cp2-padded"] = _compare(
        loss[:, is_real], pad_ref_loss[:, real_pos], params, pad_ref_grads, 1, group=cp_group
    )
    return errors


def test_packed_sequences_tp2_then_cp2():
    errors = run_distributed(_body, 2, timeout=300)
    for rank_errors in errors:
        assert max(rank_errors.values()) <= 1e-6, rank_errors
