"""The forward_step_func / loss_func contract, config hooks and input errors of the schedules.

Loss scaling is checked against gradients computed by hand (not against another schedule):
2-tuple loss -> loss * cp / M; 3-tuple -> loss / max(num_tokens, 1) / M, or no division with
calculate_per_token_loss (finalize_model_grads_func then receives the token count).
"""

import contextlib
from functools import partial

import pytest
import torch

from gigatron.core import parallel_state as ps
from gigatron.core.pipeline_parallel import get_forward_backward_func
from gigatron.core.pipeline_parallel.schedules import (
    forward_backward_no_pipelining,
    forward_backward_pipelining_with_interleaving,
    forward_backward_pipelining_without_interleaving,
)
from gigatron.testing import run_distributed
from tests.core.pipeline_parallel.test_schedules import B, Chunk, Full, L, S, _batches, _Config

pytestmark = pytest.mark.multirank


M = 4


def _close(actual, expected, rtol=1e-6):
    """Max error within rtol of the largest entry (sums in another order differ in the last bit)."""
    err = (actual - expected).abs().max().item()
    assert err <= rtol * expected.abs().max().item(), (err, expected.abs().max().item())


def _step(loss_func_kind, data_iterator, model):
    tokens, labels, mask = next(data_iterator)
    out = model(tokens, labels)  # [b, s] per-token loss

    def loss_func(per_token, non_loss_data=False):
        if non_loss_data:
            return {"shape": tuple(per_token.shape)}
        total = (per_token * mask).sum()
        if loss_func_kind == "two":
            loss = total / mask.sum()
            return loss, {"aliased": loss}  # the report aliases the loss: scaled in place too
        if loss_func_kind == "zero_tokens":
            return total * 0, torch.tensor(0, dtype=torch.int), {}
        return total, mask.sum().to(torch.int), {"lm loss": total.detach()}

    return out, (None if loss_func_kind == "none" else loss_func)


def _expected_grads(data, kind, per_token=False, cp=1):
    full = Full(3)
    model = Chunk(_Config(), full, 0, L, True, True)
    total = 0
    for tokens, labels, mask in data:
        s = (model(tokens, labels) * mask).sum()
        if kind == "two":
            total = total + s / mask.sum() * cp / M
        elif per_token:
            total = total + s
        else:
            total = total + s / mask.sum() / M
    total.backward()
    return [p.grad for p in model.parameters()]


def _one_rank_contract():
    ps.initialize_model_parallel()
    data = _batches(M, 0)
    events = []

    @contextlib.contextmanager
    def no_sync():
        events.append("enter")
        yield
        events.append("exit")

    def finalize(models, num_tokens, **kw):
        events.append(("finalize", len(models), None if num_tokens is None else int(num_tokens)))

    for kind, per_token in [("two", False), ("three", False), ("three", True)]:
        config = _Config(calculate_per_token_loss=per_token)
        config.no_sync_func, config.finalize_model_grads_func = no_sync, finalize
        model = Chunk(config, Full(3), 0, L, True, True)
        events.clear()
        out = forward_backward_no_pipelining(
            forward_step_func=partial(_step, kind),
            data_iterator=iter(data),
            model=model,
            num_microbatches=M,
            seq_length=S,
            micro_batch_size=B,
        )
        assert len(out) == M
        for p, g in zip(model.parameters(), _expected_grads(data, kind, per_token)):
            _close(p.grad, g)
        tokens = int(sum(mask.sum() for _, _, mask in data))
        # M - 1 microbatches under no_sync, the last outside; then finalize([model], tokens|None)
        assert events[:2] == ["enter", "exit"]
        assert events[-1] == ("finalize", 1, tokens if per_token else None), events
        if kind == "two":
            ref = [(m(t, lab) * k).sum() / k.sum() / M for (t, lab, k), m in zip(data, [model] * M)]
            for r, e in zip(out, ref):
                _close(r["aliased"].detach(), e.detach())

    # all tokens masked: max(num_tokens, 1) keeps the loss finite
    config = _Config()
    model = Chunk(config, Full(3), 0, L, True, True)
    forward_backward_no_pipelining(
        forward_step_func=partial(_step, "zero_tokens"), data_iterator=iter(data), model=model,
        num_microbatches=M, seq_length=S, micro_batch_size=B,
    )  # fmt: skip
    assert all(torch.isfinite(p.grad).all() and (p.grad == 0).all() for p in model.parameters())

    # grad_scale_func scales what backward starts from; timers see every phase
    timed = []

    class _Timer:
        def __init__(self, name):
            self.name = name

        def start(self, barrier=False):
            timed.append(("start", self.name))

        def stop(self):
            timed.append(("stop", self.name))

    config = _Config(
        grad_scale_func=lambda loss: loss * 8.0, timers=lambda n, log_level=0: _Timer(n)
    )
    model = Chunk(config, Full(3), 0, L, True, True)
    forward_backward_no_pipelining(
        forward_step_func=partial(_step, "three"), data_iterator=iter(data), model=model,
        num_microbatches=M, seq_length=S, micro_batch_size=B,
    )  # fmt: skip
    for p, g in zip(model.parameters(), _expected_grads(data, "three")):
        _close(p.grad, g * 8.0)
    assert timed[0] == ("start", "forward-backward") and timed[-1] == ("stop", "forward-backward")
    for name in ("forward-compute", "backward-compute"):
        assert timed.count(("start", name)) == timed.count(("stop", name)) == M

    # collect_non_loss_data / loss_func None / forward_only: raw results stored, no grads
    config = _Config(finalize_model_grads_func=finalize)
    model = Chunk(config, Full(3), 0, L, True, True)
    events.clear()
    kw = dict(num_microbatches=M, seq_length=S, micro_batch_size=B, forward_only=True)
    out = forward_backward_no_pipelining(
        forward_step_func=partial(_step, "three"), data_iterator=iter(data), model=model,
        collect_non_loss_data=True, **kw,
    )  # fmt: skip
    assert out == [{"shape": (B, S)}] * M
    out = forward_backward_no_pipelining(
        forward_step_func=partial(_step, "none"), data_iterator=iter(data), model=model, **kw
    )
    assert len(out) == M and out[0].shape == (B, S)
    assert all(p.grad is None for p in model.parameters()) and events == []
    assert get_forward_backward_func() is forward_backward_no_pipelining


@pytest.mark.timeout(120)
def test_one_rank_loss_scaling_and_hooks():
    run_distributed(_one_rank_contract, 1, timeout=100)


def _cp_factor():
    # 2-tuple losses are multiplied by the CP size (each CP rank holds a mean over its shard)
    ps.initialize_model_parallel(context_parallel_size=2)
    data = _batches(M, 0)
    model = Chunk(_Config(context_parallel_size=2), Full(3), 0, L, True, True)
    forward_backward_no_pipelining(
        forward_step_func=partial(_step, "two"), data_iterator=iter(data), model=model,
        num_microbatches=M, seq_length=S, micro_batch_size=B,
    )  # fmt: skip
    for p, g in zip(model.parameters(), _expected_grads(data, "two", cp=2)):
        _close(p.grad, g)


def _pp2_hooks(per_token):
    ps.initialize_model_parallel(
        pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2
    )
    rank = ps.get_pipeline_model_parallel_rank()
    events = []

    @contextlib.contextmanager
    def no_sync():
        events.append("no_sync")
        yield
        events.append("sync")

    config = _Config(
        pipeline_model_parallel_size=2,
        virtual_pipeline_model_parallel_size=2,
        pipeline_dtype=torch.float32,
        calculate_per_token_loss=per_token,
        no_sync_func=no_sync,
        grad_sync_func=lambda params: events.append(("grad_sync", len(list(params)))),
        param_sync_func=lambda params: events.append(("param_sync", len(list(params)))),
        finalize_model_grads_func=lambda models, n, **kw: events.append(
            ("finalize", len(models), None if n is None else int(n))
        ),
    )
    full = Full(3)
    per = L // 4
    chunks = [Chunk(config, full, (c * 2 + rank) * per, per, c * 2 + rank == 0,
                    c * 2 + rank == 3) for c in range(2)]  # fmt: skip
    data = _batches(M, 0)
    out = forward_backward_pipelining_with_interleaving(
        forward_step_func=partial(_step, "three"),
        data_iterator=[iter(data), iter(data)],
        model=chunks,
        num_microbatches=M,
        seq_length=S,
        micro_batch_size=B,
    )
    tokens = int(sum(mask.sum() for _, _, mask in data))
    return rank, len(out), events, tokens


@pytest.mark.timeout(120)
def test_cp_factor_and_pp_hooks():
    run_distributed(_cp_factor, 2, timeout=100)
    for per_token in (False, True):
        for rank, n_out, events, tokens in run_distributed(
            _pp2_hooks, 2, args=(per_token,), timeout=100
        ):
            assert n_out == (M if rank == 1 else 0)
            hooks = [e for e in events if isinstance(e, tuple)]
            # 2 chunks x L/4 Linear layers (weight, bias) + embedding (rank 0) or head (rank 1)
            chunk_params = 2 * 2 * (L // 4) + (1 if rank == 0 else 2)
            # param sync once per chunk before its first forward, grad sync once per chunk after
            # its last backward, then finalize over both chunks (token count on the last stage)
            assert [h[0] for h in hooks] == ["param_sync", "param_sync", "grad_sync",
                                             "grad_sync", "finalize"], hooks  # fmt: skip
            assert sum(h[1] for h in hooks if h[0] == "grad_sync") == chunk_params
            expect_tokens = (tokens if rank == 1 else 0) if per_token else None
            assert hooks[-1] == ("finalize", 2, expect_tokens)
            assert events[0] == "no_sync" and "sync" in events


def _errors():
    ps.initialize_model_parallel(pipeline_model_parallel_size=2)
    rank = ps.get_pipeline_model_parallel_rank()
    full = Full(3)
    config = _Config(pipeline_dtype=torch.float32)
    kw = dict(seq_length=S, micro_batch_size=B, forward_step_func=partial(_step, "three"))
    one = Chunk(config, full, 0, 4, rank == 0, rank == 1)
    two = [Chunk(config, full, 0, 2, rank == 0, False), Chunk(config, full, 2, 2, False, rank == 1)]
    caught = []

    def expect(exc, pattern, fn, **more):
        with pytest.raises(exc, match=pattern):
            fn(**kw, **more)
        caught.append(pattern)

    config.pipeline_dtype = None
    expect(ValueError, r"pipeline_dtype must be set .* \(2\) > 1",
           forward_backward_pipelining_without_interleaving, model=one,
           data_iterator=iter([]), num_microbatches=4)  # fmt: skip
    config.pipeline_dtype = torch.float32
    interleaved = forward_backward_pipelining_with_interleaving
    no_data = [iter([]), iter([])]
    expect(ValueError, r"size_per_vp_stage \(2\) must lie in \[.*\(2\), num_microbatches \(1\)\]",
           interleaved, model=two, data_iterator=no_data, num_microbatches=1)  # fmt: skip
    config.microbatch_group_size_per_vp_stage = 2
    expect(RuntimeError, r"num_microbatches \(3\) % microbatch_group_size_per_vp_stage \(2\)",
           interleaved, model=two, data_iterator=no_data, num_microbatches=3)  # fmt: skip
    expect(ValueError, r"list of model chunks", interleaved, model=one, data_iterator=iter([]),
           num_microbatches=4)  # fmt: skip
    expect(ValueError, r"data_iterator has 1 entries; this schedule needs 2", interleaved,
           model=two, data_iterator=[iter([])], num_microbatches=4)  # fmt: skip
    expect(ValueError, r"model has 2 entries; this schedule needs 1",
           forward_backward_pipelining_without_interleaving, model=two,
           data_iterator=iter([]), num_microbatches=4)  # fmt: skip
    # the wrong shape raises before it is sent (the peer would otherwise wait forever)
    if rank == 0:
        with pytest.raises(ValueError, match=r"shape \(8, 2, 16\) differs from the expected \(4"):
            forward_backward_pipelining_without_interleaving(
                forward_step_func=partial(_step, "three"), model=one, num_microbatches=2,
                data_iterator=iter(_batches(2, 0)), seq_length=4, micro_batch_size=B,
            )  # fmt: skip
        caught.append("shape")
    return caught


@pytest.mark.timeout(120)
def test_errors_before_any_communication():
    caught = run_distributed(_errors, 2, timeout=100)
    assert len(caught[0]) == 7 and len(caught[1]) == 6
