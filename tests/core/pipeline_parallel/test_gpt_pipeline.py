"""A small GPTModel split over pipeline stages (and TP x PP x DP) trains like the one-rank model.

The one-rank reference (DDP + Megatron optimizer, no pipelining, all microbatches of a step on
one rank) runs in its own process and hands its initial weights, per-step losses and step-1
gradients back as NumPy. Each pipelined rank builds its stage(s) with pre_process/post_process
and vp_stage, loads its slice of those weights (TP shard by shape), wraps each chunk in DDP and
trains with the same optimizer. Tied embedding/output weights: the last stage's copy is filled
from the embedding and its grad is summed with the first stage's by finalize_model_grads.
Losses at every step and all step-1 gradients agree to 1e-6 relative.
"""

from functools import partial

import numpy as np
import pytest
import torch

from gigatron.core import parallel_state as ps
from gigatron.core import tensor_parallel
from gigatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from gigatron.core.pipeline_parallel import get_forward_backward_func
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


V, H, HEADS, L, S, B, STEPS = 32, 16, 2, 4, 8, 2, 10
RTOL = 1e-6


def _config(tp=1, pp=1, vp=None):
    return TransformerConfig(
        num_layers=L,
        hidden_size=H,
        num_attention_heads=HEADS,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp,
        pipeline_dtype=torch.float32,
        use_cpu_initialization=True,
    )


def _data(step, num_microbatches):
    g = torch.Generator().manual_seed(500 + step)
    out = []
    for _ in range(num_microbatches):
        tokens = torch.randint(0, V, (B, S), generator=g)
        mask = (torch.rand(B, S, generator=g) > 0.25).float()
        out.append((tokens, torch.roll(tokens, -1, 1), mask))
    return out


def _loss_func(mask, per_token_loss):  # [b, s] unreduced, as GPTModel returns it
    total = (per_token_loss * mask).sum()
    n = mask.sum().to(torch.int)
    return total, n, {"lm loss": torch.stack([total.detach(), n.float()])}


def _forward_step(data_iterator, model):
    tokens, labels, mask = next(data_iterator)
    pos = torch.arange(S)[None].expand(B, -1)
    return model(tokens, pos, None, labels=labels), partial(_loss_func, mask)


def _train(chunks, microbatches_of_step, fb, pp_last):
    """10 steps; returns (reports per step on the last stage, main grads after step 1)."""
    config = chunks[0].config
    ddp = [DistributedDataParallel(config, DistributedDataParallelConfig(), c) for c in chunks]
    config.no_sync_func = [d.no_sync for d in ddp]
    config.finalize_model_grads_func = finalize_model_grads
    opt = get_megatron_optimizer(OptimizerConfig(lr=1e-2, weight_decay=0.0), ddp)
    reports, grads = [], {}
    for step in range(STEPS):
        for d in ddp:
            d.zero_grad_buffer()
        opt.zero_grad()
        data = microbatches_of_step(step)
        out = fb(
            forward_step_func=_forward_step,
            data_iterator=[iter(data) for _ in ddp] if len(ddp) > 1 else iter(data),
            model=ddp if len(ddp) > 1 else ddp[0],
            num_microbatches=len(data),
            seq_length=S,
            micro_batch_size=B,
        )
        if pp_last:
            reports.append(np.stack([r["lm loss"].numpy() for r in out]).sum(0))
        if step == 0:
            for c in chunks:
                for name, p in c.named_parameters():
                    grads[_full_name(c, name)] = p.main_grad.detach().numpy().copy()
        ok, _, _ = opt.step()
        assert ok
    return reports, grads


def _full_name(chunk, name):
    """Parameter name in the unsplit model: global layer index; tied output = embedding."""
    if name.startswith("decoder.layers."):
        i, rest = name[len("decoder.layers.") :].split(".", 1)
        return f"decoder.layers.{chunk.decoder.layers[int(i)].layer_number - 1}.{rest}"
    if name == "output_layer.weight":
        return "embedding.word_embeddings.weight"
    return name


def _tp_slice(full, local_shape, tp, tp_rank):
    """This TP rank's shard of a full tensor: split along the one dim whose size differs."""
    if tuple(full.shape) == tuple(local_shape):
        return full
    (dim,) = [d for d, (f, n) in enumerate(zip(full.shape, local_shape)) if f != n]
    assert full.shape[dim] == local_shape[dim] * tp
    return np.split(full, tp, axis=dim)[tp_rank]


def _reference(num_microbatches_list):
    """One rank, no pipelining: weights, per-step (sum loss, tokens) and step-1 grads."""
    ps.initialize_model_parallel()
    out = {}
    for m in num_microbatches_list:
        tensor_parallel.model_parallel_cuda_manual_seed(11)
        torch.manual_seed(11)
        model = GPTModel(_config(), get_gpt_layer_local_spec(), V, S,
                         share_embeddings_and_output_weights=True)  # fmt: skip
        weights = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
        reports, grads = _train([model], lambda step, m=m: _data(step, m),
                                get_forward_backward_func(), True)  # fmt: skip
        out[m] = (weights, reports, grads)
    return out


def _pipelined(tp, pp, vp, dp_microbatches, weights):
    """Train the split model; `dp_microbatches` per DP rank (global batch = dp x that)."""
    ps.initialize_model_parallel(tp, pp, vp)
    tensor_parallel.model_parallel_cuda_manual_seed(11)
    tp_rank, pp_rank = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    dp_rank = ps.get_data_parallel_rank()
    config = _config(tp, pp, vp)
    chunks = []
    for c in range(vp or 1):
        pre = pp_rank == 0 and c == 0
        post = pp_rank == pp - 1 and c == (vp or 1) - 1
        model = GPTModel(config, get_gpt_layer_local_spec(), V, S, pre_process=pre,
                         post_process=post, share_embeddings_and_output_weights=True,
                         vp_stage=None if vp is None else c)  # fmt: skip
        with torch.no_grad():
            for name, p in model.named_parameters():
                full = weights[_full_name(model, name)]
                p.copy_(torch.from_numpy(_tp_slice(full, p.shape, tp, tp_rank)))
        chunks.append(model)
    m = dp_microbatches

    def data_of_step(step):
        return _data(step, m * ps.get_data_parallel_world_size())[dp_rank * m : (dp_rank + 1) * m]

    fb = get_forward_backward_func()
    reports, grads = _train(chunks, data_of_step, fb, pp_rank == pp - 1)
    ref_shapes = {n: g.shape for n, g in grads.items()}
    return dict(tp_rank=tp_rank, pp_rank=pp_rank, dp_rank=dp_rank, reports=reports,
                grads=grads, shapes=ref_shapes)  # fmt: skip


@pytest.fixture(scope="module")
def reference():
    return run_distributed(_reference, 1, args=([4, 8],), timeout=150)[0]


def _check(results, ref, tp):
    _, ref_reports, ref_grads = ref
    # losses: sum the last stages' (sum, tokens) over DP ranks (TP ranks hold copies)
    last = [r for r in results if r["reports"] and r["tp_rank"] == 0]
    worst_loss = worst_grad = 0.0
    for step in range(STEPS):
        got = sum(r["reports"][step] for r in last)
        want = ref_reports[step]
        err = abs(got[0] / got[1] - want[0] / want[1]) / abs(want[0] / want[1])
        assert err <= RTOL, (step, err)
        worst_loss = max(worst_loss, err)
    seen = set()
    for r in results:
        for name, g in r["grads"].items():
            full = ref_grads[name]
            want = _tp_slice(full, g.shape, tp, r["tp_rank"])
            err = np.abs(g - want).max() / max(np.abs(want).max(), 1e-30)
            assert err <= RTOL, (name, r["pp_rank"], r["tp_rank"], err)
            worst_grad = max(worst_grad, err)
            seen.add(name)
    assert seen == set(ref_grads)  # every parameter of the model was checked somewhere
    return worst_loss, worst_grad


@pytest.mark.timeout(300)
def test_gpt_pp2_1f1b_and_interleaved(reference):
    for vp, m in [(None, 4), (None, 8), (2, 4), (2, 8)]:
        results = run_distributed(_pipelined, 2, args=(1, 2, vp, m, reference[m][0]), timeout=150)
        _check(results, reference[m], tp=1)


@pytest.mark.timeout(300)
def test_gpt_pp4_1f1b(reference):
    for m in (4, 8):
        results = run_distributed(_pipelined, 4, args=(1, 4, None, m, reference[m][0]), timeout=200)
        _check(results, reference[m], tp=1)


@pytest.mark.timeout(400)
def test_gpt_tp2_pp2_dp2(reference):
    # 2 DP ranks x 4 microbatches = the reference's 8 microbatches per step
    results = run_distributed(_pipelined, 8, args=(2, 2, None, 4, reference[8][0]), timeout=300)
    _check(results, reference[8], tp=2)
