"""Pipeline schedules on gloo ranks against the one-rank no-pipelining run of the same model.

Stand-in model (its own, so these tests do not wait on GPTModel): token embedding on the first
virtual stage, L Linear+tanh layers split over pp * vp virtual stages, head + per-token cross
entropy on the last. Full weights come from one seed; every rank also keeps the unsplit twin and
trains it with forward_backward_no_pipelining on the same microbatches. Loss at each of 10 Adam
steps and every gradient after step 1 must agree to 1e-6 relative (fp32).
"""

from dataclasses import dataclass
from functools import partial

import pytest
import torch

from gigatron.core import parallel_state as ps
from gigatron.core.model_parallel_config import ModelParallelConfig
from gigatron.core.pipeline_parallel import get_forward_backward_func
from gigatron.core.pipeline_parallel.schedules import forward_backward_no_pipelining
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


V, H, S, B, L = 24, 16, 8, 2, 8  # vocab, hidden, seq, micro-batch, layers
RTOL = 1e-6


@dataclass(kw_only=True)
class _Config(ModelParallelConfig):
    hidden_size: int = H
    calculate_per_token_loss: bool = False


class Chunk(torch.nn.Module):
    """Virtual stages [first, first + n) of the stand-in model; s: seq, b: batch, h: hidden."""

    def __init__(self, config, full, first_layer, num_layers, pre_process, post_process):
        super().__init__()
        self.config, self.pre_process, self.post_process = config, pre_process, post_process
        self.embedding = full.embedding if pre_process else None
        self.layers = torch.nn.ModuleList(full.layers[first_layer : first_layer + num_layers])
        self.head = full.head if post_process else None
        self.input_tensor = None

    def set_input_tensor(self, input_tensor):
        self.input_tensor = input_tensor[0]

    def forward(self, tokens, labels):
        if self.pre_process:
            h = self.embedding(tokens).transpose(0, 1).contiguous()  # [s, b, h]
        else:
            h = self.input_tensor  # [s, b, h] from the previous stage
        for layer in self.layers:
            h = torch.tanh(layer(h))
        if not self.post_process:
            return h
        logits = self.head(h).transpose(0, 1)  # [b, s, V]
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, V), labels.reshape(-1), reduction="none"
        ).view_as(labels)  # [b, s] per-token loss, like GPTModel


class Full(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embedding = torch.nn.Embedding(V, H)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(H, H) for _ in range(L))
        self.head = torch.nn.Linear(H, V)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def _batches(num_microbatches, step, varlen=False, device="cpu"):
    g = torch.Generator().manual_seed(1000 + step)
    out = []
    for i in range(num_microbatches):
        seq = S - 2 * (i % 3) if varlen else S
        tokens = torch.randint(0, V, (B, seq), generator=g)
        mask = (torch.rand(B, seq, generator=g) > 0.2).float()
        out.append(tuple(t.to(device) for t in (tokens, torch.roll(tokens, -1, 1), mask)))
    return out


def _loss_func(mask, three_tuple, per_token_loss):  # [b, s]
    if three_tuple:
        total = (per_token_loss * mask).sum()
        n = mask.sum().to(torch.int)
        return total, n, {"lm loss": torch.stack([total.detach(), n.float()])}
    loss = (per_token_loss * mask).sum() / mask.sum()
    return loss, {"lm loss": loss.detach().clone()}


def _forward_step(three_tuple, data_iterator, model):
    tokens, labels, mask = next(data_iterator)
    return model(tokens, labels), partial(_loss_func, mask, three_tuple)


def _mean_loss(reports, three_tuple):
    if three_tuple:
        t = torch.stack([r["lm loss"] for r in reports]).sum(0)
        return (t[0] / t[1]).item()
    return torch.stack([r["lm loss"] for r in reports]).mean().item()


def _build_chunks(config, full, pp, vp, rank):
    per_chunk = L // (pp * max(vp or 1, 1))
    chunks = []
    for c in range(vp or 1):
        stage = c * pp + rank  # chunk c on rank r holds layers [(c*pp + r) * L/(pp*vp), ...)
        last = stage == pp * (vp or 1) - 1
        chunks.append(Chunk(config, full, stage * per_chunk, per_chunk, stage == 0, last))
    return chunks


def _train_and_compare(pp, vp, num_microbatches, three_tuple, steps, seed, **cfg):
    """Train the split model and its unsplit twin side by side; return max relative errors."""
    rank = ps.get_pipeline_model_parallel_rank()
    varlen = cfg.pop("varlen", False)  # sequence length differs between microbatches
    device = cfg.pop("device", "cpu")
    config = _Config(pipeline_dtype=torch.float32, **cfg)
    full_ref, full_pp = Full(seed).to(device), Full(seed).to(device)
    ref = Chunk(config, full_ref, 0, L, True, True)
    chunks = _build_chunks(config, full_pp, pp, vp, rank)
    params = [p for c in chunks for p in c.parameters()]
    ref_of = dict(zip(map(id, full_pp.parameters()), full_ref.parameters()))
    opt, opt_ref = torch.optim.Adam(params, lr=1e-2), torch.optim.Adam(ref.parameters(), lr=1e-2)
    fb = get_forward_backward_func(pp, vp)
    worst_loss, worst_grad, fwd_only_err = 0.0, 0.0, 0.0
    for step in range(steps):
        data = _batches(num_microbatches, step, varlen=varlen, device=device)
        opt.zero_grad(), opt_ref.zero_grad()
        kw = dict(num_microbatches=num_microbatches, seq_length=S, micro_batch_size=B)
        iters = [iter(data) for _ in chunks]
        out = fb(
            forward_step_func=partial(_forward_step, three_tuple),
            data_iterator=iters if vp else iters[0],
            model=chunks if vp else chunks[0],
            **kw,
        )
        out_ref = forward_backward_no_pipelining(
            forward_step_func=partial(_forward_step, three_tuple),
            data_iterator=iter(data),
            model=ref,
            **kw,
        )
        assert len(out_ref) == num_microbatches
        if rank == pp - 1:
            assert len(out) == num_microbatches
            a, b = _mean_loss(out, three_tuple), _mean_loss(out_ref, three_tuple)
            worst_loss = max(worst_loss, abs(a - b) / abs(b))
        else:
            assert out == []
        if step == 0:
            for p in params:
                g_ref = ref_of[id(p)].grad
                assert p.grad is not None
                err = (p.grad - g_ref).abs().max() / g_ref.abs().max().clamp_min(1e-30)
                worst_grad = max(worst_grad, err.item())
        opt.step(), opt_ref.step()
    # evaluation: forward_only on the trained weights gives the same losses, and no grads
    data = _batches(num_microbatches, 99, device=device)
    opt.zero_grad(set_to_none=True)
    out = fb(
        forward_step_func=partial(_forward_step, three_tuple),
        data_iterator=[iter(data) for _ in chunks] if vp else iter(data),
        model=chunks if vp else chunks[0],
        num_microbatches=num_microbatches,
        seq_length=S,
        micro_batch_size=B,
        forward_only=True,
    )
    assert all(p.grad is None for p in params)
    if rank == pp - 1:
        out_ref = forward_backward_no_pipelining(
            forward_step_func=partial(_forward_step, three_tuple),
            data_iterator=iter(data),
            model=ref,
            num_microbatches=num_microbatches,
            seq_length=S,
            micro_batch_size=B,
            forward_only=True,
        )
        a, b = _mean_loss(out, three_tuple), _mean_loss(out_ref, three_tuple)
        fwd_only_err = abs(a - b) / abs(b)
    else:
        assert out == []
    return worst_loss, worst_grad, fwd_only_err


def _parity_cases(pp, cases):
    results = []
    for vp, m, three_tuple, cfg in cases:
        ps.initialize_model_parallel(
            pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vp
        )
        errs = _train_and_compare(pp, vp, m, three_tuple, steps=10, seed=7 + m, **cfg)
        results.append(((vp, m, three_tuple, cfg), errs))
        ps.destroy_model_parallel()
    return results


def _assert_parity(results):
    for per_rank in zip(*results):
        for case, (loss_err, grad_err, fwd_err) in per_rank:
            assert loss_err <= RTOL, (case, loss_err)
            assert grad_err <= RTOL, (case, grad_err)
            assert fwd_err <= RTOL, (case, fwd_err)


@pytest.mark.timeout(200)
def test_pp2_1f1b_and_interleaved_match_no_pipelining():
    cases = [
        (None, 4, True, {}),
        (None, 8, False, {}),
        (2, 4, True, {}),
        (2, 8, True, {"deallocate_pipeline_outputs": True}),
        (2, 6, True, {"microbatch_group_size_per_vp_stage": 3}),
        (2, 4, False, {"batch_p2p_comm": False, "variable_seq_lengths": True, "varlen": True}),
    ]
    _assert_parity(run_distributed(_parity_cases, 2, args=(2, cases), timeout=180))


@pytest.mark.timeout(200)
def test_pp4_1f1b_matches_no_pipelining():
    cases = [
        (None, 4, True, {}),
        (None, 8, True, {"deallocate_pipeline_outputs": True}),
        (None, 4, True, {"variable_seq_lengths": True, "varlen": True}),
    ]
    _assert_parity(run_distributed(_parity_cases, 4, args=(4, cases), timeout=180))
