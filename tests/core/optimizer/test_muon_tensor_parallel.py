"""Muon under tensor parallelism on 2 gloo ranks.

- `newton_schulz_tp` on the shards of a fixed matrix (split along rows or columns) equals this
  rank's slice of `newton_schulz` of the whole matrix: "duplicated" bit for bit also in the bf16
  ("medium") iteration, "distributed" to 1e-6 in fp32.
- One step of `get_megatron_optimizer(optimizer='muon')` on a TP = 2 GQA GPT model equals the
  reference step (`_muon_reference`, QKV split, AdamW on embeddings / norms) applied to the
  TP = 1 model's full weights and grads, to 1e-6 ("duplicated" and "distributed"), and for
  "blockwise" the reference applied to each shard on its own.
"""

import pytest
import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.core.models.common.tp_state_dict import shard_for_rank
from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from gigatron.core.optimizer._newton_schulz import newton_schulz, newton_schulz_tp
from gigatron.testing import run_distributed
from tests.core.optimizer import _muon_reference as ref
from tests.core.optimizer._gpt_tiny import tiny_gpt

pytestmark = pytest.mark.multirank

LR, WD = 1e-2, 0.1
SPLIT = [16, 8, 8]  # Q, K, V rows of one query group (tiny_gpt)


def _ns_shards_body():
    ps.initialize_model_parallel(2)
    group, rank = ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_rank()
    full = torch.randn(24, 40, generator=torch.Generator().manual_seed(3))
    errors = {}
    prev = torch.get_float32_matmul_precision()
    try:
        for precision in ("highest", "medium"):
            torch.set_float32_matmul_precision(precision)
            whole = newton_schulz(full, 5, "quintic")
            for dim in (0, 1):
                shard = full.chunk(2, dim=dim)[rank]
                for mode in ("duplicated", "distributed"):
                    out = newton_schulz_tp(shard, 5, "quintic", group, dim, mode)
                    err = (out - whole.chunk(2, dim=dim)[rank]).abs().max().item()
                    errors[(precision, dim, mode)] = err
    finally:
        torch.set_float32_matmul_precision(prev)
    return errors


def test_newton_schulz_tp_equals_whole_matrix():
    for errors in run_distributed(_ns_shards_body, world_size=2):
        for (precision, dim, mode), err in errors.items():
            if mode == "duplicated":
                assert err == 0.0, (precision, dim, mode, err)
            elif precision == "highest":
                assert err < 1e-6, (precision, dim, mode, err)
            else:  # bf16 partial Gram matrices summed over ranks round differently
                assert err < 5e-2, (precision, dim, mode, err)


def _forward_backward(model):
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(7))
    model(ids, None, None, labels=ids).mean().backward()


def _is_muon(name, p):
    return p.dim() == 2 and "word_embeddings" not in name and "output_layer" not in name


def _expected(name, w, g, adam_new, tp_rank, tp, param, blockwise):
    """This rank's expected weight after one step, from full weight `w` and grad `g`."""
    if not _is_muon(name, w):
        return shard_for_rank(adam_new, param, tp_rank, tp)
    u = (1 - 0.95) * g  # first step: the momentum buffer is (1 - mu) g
    if blockwise:  # each shard orthogonalised (and scaled) on its own
        w, u = shard_for_rank(w, param, tp_rank, tp), shard_for_rank(u, param, tp_rank, tp)
    if "linear_qkv" in name:
        update = ref.muon_qkv_update(u, SPLIT)
    else:
        update = ref.scale(*u.shape) * ref.newton_schulz(u)
    new = w * (1 - LR * WD) - LR * update
    return new if blockwise else shard_for_rank(new, param, tp_rank, tp)


def _muon_tp_body(tp_mode):
    torch.set_num_threads(1)
    config = OptimizerConfig(
        optimizer="muon",
        lr=LR,
        weight_decay=WD,
        clip_grad=0.0,
        muon_fp32_matmul_prec="highest",
        muon_tp_mode=tp_mode,
    )
    ps.initialize_model_parallel(1)
    model = tiny_gpt(tp=1)
    _forward_backward(model)
    full = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    others = [p for n, p in model.named_parameters() if not _is_muon(n, p)]
    no_wd = [p for p in others if p.dim() == 1]
    adam = torch.optim.AdamW(
        [dict(params=[p for p in others if p.dim() != 1]), dict(params=no_wd, weight_decay=0.0)],
        lr=LR,
        weight_decay=WD,
    )
    adam.step()
    adam_new = {n: p.detach().clone() for n, p in model.named_parameters()}
    ps.destroy_model_parallel()

    ps.initialize_model_parallel(2)
    tp_rank = ps.get_tensor_model_parallel_rank()
    model = tiny_gpt(tp=2)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(shard_for_rank(full[name], p, tp_rank, 2))
    opt = get_megatron_optimizer(config, [model])
    _forward_backward(model)
    assert opt.step()[0]
    errors = {}
    for name, p in params.items():
        expected = _expected(
            name, full[name], grads[name], adam_new[name], tp_rank, 2, p, tp_mode == "blockwise"
        )
        errors[name] = (p.detach() - expected).abs().max().item()
    qkv = params["decoder.layers.0.self_attention.linear_qkv.weight"]
    dist.barrier()
    return errors, bool(qkv.is_qkv), bool(qkv.tensor_model_parallel)


@pytest.mark.parametrize("tp_mode", ["duplicated", "distributed", "blockwise"])
def test_muon_step_at_tp2_equals_reference(tp_mode):
    for errors, is_qkv, split in run_distributed(_muon_tp_body, world_size=2, args=(tp_mode,)):
        assert is_qkv and split
        assert len(errors) > 10
        bad = {n: e for n, e in errors.items() if not e < 1e-6}
        assert not bad, bad
