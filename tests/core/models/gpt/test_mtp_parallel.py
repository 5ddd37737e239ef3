"""GPTModel with multi-token prediction through the pipeline schedule: TP = 2 (with and without
SP), PP = 2 (the MTP block and its copy of the word embedding on the last stage, tied or not
to the output layer) and CP = 2 give the one-rank run's LM losses, logged MTP losses and every
main grad (fp32, 1e-5).

Both sides build the model with the layout-invariant CPU initialisation, so no weights are
copied. Megatron's MTP loss divides each CP rank's sum by its own token count and DDP averages
over CP, so the CP case uses a loss mask that leaves both CP ranks the same number of valid
tokens at the main depth and after the one-token roll (positions 0 and 8 of 16 masked: rank 0
holds 0-3 and 12-15, rank 1 holds 4-11); with equal counts the mean of the ranks' means is the
global mean.
"""

import pytest
import torch

from gigatron.core import parallel_state as ps
from gigatron.core import tensor_parallel
from gigatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from gigatron.core.layout_invariant_init import set_layout_invariant_init_seed
from gigatron.core.models.common.tp_state_dict import tp_split_of
from gigatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_mtp_block_spec,
)
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.pipeline_parallel import get_forward_backward_func
from gigatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.core.utils import get_batch_on_this_cp_rank
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank

V, S, B, M = 64, 16, 2, 2


def _batches():
    gen = torch.Generator().manual_seed(9)
    tokens = torch.randint(0, V, (M, B, S + 1), generator=gen)
    mask = torch.ones(B, S)
    mask[:, [0, 8]] = 0.0
    return [
        {
            "tokens": t[:, :-1].contiguous(),
            "labels": t[:, 1:].contiguous(),
            "loss_mask": mask.clone(),
            "position_ids": torch.arange(S).expand(B, S).contiguous(),
        }
        for t in tokens
    ]


def _loss(loss_mask, per_token):
    total = (per_token * loss_mask).sum()
    count = loss_mask.sum()
    report = torch.stack([total.detach().clone(), count.detach().clone()])
    return total, count.to(torch.int), {"lm loss": report}


def _forward_step(data_iterator, model):
    batch = get_batch_on_this_cp_rank(dict(next(data_iterator)))
    out = model(
        batch["tokens"], batch["position_ids"], None,
        labels=batch["labels"], loss_mask=batch["loss_mask"],
    )  # fmt: skip
    return out, lambda per_token: _loss(batch["loss_mask"], per_token)


def _run(tp: int, pp: int, cp: int, sp: bool, depths: int, tied: bool, fused: bool):
    torch.set_num_threads(1)
    ps.initialize_model_parallel(tp, pp, context_parallel_size=cp)
    tensor_parallel.model_parallel_cuda_manual_seed(3)
    set_layout_invariant_init_seed(7)
    cfg = TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        context_parallel_size=cp, sequence_parallel=sp, pipeline_dtype=torch.float32,
        mtp_num_layers=depths, mtp_loss_scaling_factor=0.3, gradient_accumulation_fusion=fused,
    )  # fmt: skip
    pp_rank = ps.get_pipeline_model_parallel_rank()
    spec = get_gpt_layer_local_spec()
    model = GPTModel(
        cfg, spec, V, S, pre_process=pp_rank == 0, post_process=pp_rank == pp - 1,
        position_embedding_type="rope", share_embeddings_and_output_weights=tied,
        mtp_block_spec=get_gpt_mtp_block_spec(cfg, spec, use_transformer_engine=False),
    )  # fmt: skip
    set_layout_invariant_init_seed(None)
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(), model)
    cfg.finalize_model_grads_func = finalize_model_grads
    out = get_forward_backward_func()(
        forward_step_func=_forward_step, data_iterator=iter(_batches()), model=ddp,
        num_microbatches=M, seq_length=S // cp, micro_batch_size=B,
    )  # fmt: skip
    losses = {}
    MTPLossLoggingHelper.track_mtp_metrics(1.0 / M, 1, None, total_loss_dict=losses)
    tp_rank = ps.get_tensor_model_parallel_rank()
    grads = {}
    for name, p in model.named_parameters():
        if name.startswith("decoder.layers."):
            i, rest = name[len("decoder.layers.") :].split(".", 1)
            name = f"decoder.layers.{model.decoder.layers[int(i)].layer_number - 1}.{rest}"
        grads[name] = (p.main_grad.detach().clone(), p)
    return {
        "lm": [r["lm loss"] for r in out] if out else [],
        "mtp": {k: float(v) for k, v in losses.items()},
        "grads": {n: shard_view for n, shard_view in _shards(grads, tp_rank, tp)},
        "cp_rank": ps.get_context_parallel_rank(),
        "tp_rank": tp_rank,
    }


def _shards(grads, tp_rank, tp):
    """(name, (this rank's grad, tp_rank, tp, split info)) for comparison against full grads."""
    for name, (grad, param) in grads.items():
        yield name, (grad, tp_rank, tp, tp_split_of(param))


def _compare(results, ref):
    ref_grads = {n: g for n, (g, *_) in ref["grads"].items()}
    seen, worst = set(), 0.0
    for res in results:
        for name, (grad, tp_rank, tp, split) in res["grads"].items():
            full = ref_grads[name]
            if split is not None and tp > 1:
                dim, stride = split
                chunks = torch.chunk(full, tp * stride, dim=dim)
                full = torch.cat(chunks[tp_rank::tp], dim=dim)
            torch.testing.assert_close(grad, full, rtol=1e-5, atol=1e-6, msg=name)
            worst = max(worst, (grad - full).abs().max().item())
            seen.add(name)
    assert seen == set(ref_grads), set(ref_grads) ^ seen
    ref_lm = [(r[0] / r[1]).item() for r in ref["lm"]]
    last = [r for r in results if r["lm"]]
    sums = torch.stack([torch.stack(r["lm"]) for r in last if r["tp_rank"] == 0]).sum(0)
    got_lm = (sums[:, 0] / sums[:, 1]).tolist()
    assert max(abs(a - b) for a, b in zip(got_lm, ref_lm, strict=True)) <= 1e-5, (got_lm, ref_lm)
    assert ref["mtp"], "the one-rank run logged no MTP loss"
    for r in last:
        for key, value in ref["mtp"].items():
            assert abs(r["mtp"][key] - value) <= 1e-5 * max(1.0, abs(value)), (key, r["mtp"], value)
    return worst


@pytest.mark.parametrize(
    "tp, pp, cp, sp, depths, tied, fused",
    [
        (2, 1, 1, False, 2, True, True),
        (2, 1, 1, True, 2, False, False),
        (1, 2, 1, False, 2, False, False),
        (1, 2, 1, False, 1, True, True),
        (1, 1, 2, False, 1, False, False),
    ],
    ids=["tp2-tied", "tp2-sp", "pp2", "pp2-tied", "cp2"],
)
def test_mtp_layout_matches_one_rank(tp, pp, cp, sp, depths, tied, fused):
    """`fused`: gradient_accumulation_fusion, where the tied weight's lookup and output-layer
    grads meet in main_grad (on the MTP stage too)."""
    (ref,) = run_distributed(_run, 1, args=(1, 1, 1, False, depths, tied, fused), timeout=180)
    layout = (tp, pp, cp, sp, depths, tied, fused)
    results = run_distributed(_run, tp * pp * cp, args=layout, timeout=240)
    worst = _compare(results, ref)
    print(f"tp{tp} pp{pp} cp{cp} sp{sp} D{depths}: worst grad err {worst:.2e}, mtp {ref['mtp']}")
