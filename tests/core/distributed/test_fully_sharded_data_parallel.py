"""Every Megatron-FSDP sharding strategy (and `--use-torch-fsdp2`) trains a tiny GPT exactly as
DDP + the distributed optimizer does: same losses, grad norms and updated params (fp32, 1e-6)
over 3 AdamW steps of 2 microbatches with clipping. One spawn of 4 ranks: DP 4, then TP 2 + SP
x DP 2 for each strategy; at DP 4 under optim_grads_params a rank's param + grad + optimizer
storage is within 10% of a quarter of the replicated figure, and a NaN in one rank's grad shard
skips the step on every rank. Both sides give each DP rank the
same microbatches, so the only difference is the reduction (DDP: scale by 1/dp then sum;
FSDP2: sum then divide), a last-bit effect."""

import pytest
import torch

from gigatron.core import parallel_state as ps
from gigatron.core import tensor_parallel
from gigatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    FullyShardedDataParallel,
    TorchFullyShardedDataParallel,
    TorchFullyShardedDataParallelConfig,
    finalize_model_grads,
)
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank

STEPS, NUM_MICRO, MBS, SEQ, VOCAB = 3, 2, 2, 16, 64


def _gpt(tp: int) -> GPTModel:
    torch.manual_seed(0)
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    cfg = TransformerConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        ffn_hidden_size=64,
        tensor_model_parallel_size=tp,
        sequence_parallel=tp > 1,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        add_bias_linear=False,  # the key bias's grad is 0 up to rounding, which Adam would amplify
    )
    return GPTModel(cfg, get_gpt_layer_local_spec(), VOCAB, SEQ, position_embedding_type="rope")


def _batches(dp_rank: int):
    g = torch.Generator().manual_seed(100 + dp_rank)
    tokens = torch.randint(0, VOCAB, (STEPS, NUM_MICRO, MBS, SEQ), generator=g)
    labels = torch.randint(0, VOCAB, (STEPS, NUM_MICRO, MBS, SEQ), generator=g)
    return tokens, labels


def _train(wrap, tp: int):
    """Losses and grad norms of STEPS steps, then the full params {name: tensor}."""
    model = wrap(_gpt(tp))
    config = OptimizerConfig(
        optimizer="adam", lr=1e-2, weight_decay=0.1, clip_grad=0.5, use_distributed_optimizer=True
    )
    opt = get_megatron_optimizer(config, [model])
    tokens, labels = _batches(ps.get_data_parallel_rank())
    position_ids = torch.arange(SEQ).expand(MBS, SEQ)
    losses, norms = [], []
    for step in range(STEPS):
        model.zero_grad_buffer()
        opt.zero_grad()
        for micro in range(NUM_MICRO):
            last = micro == NUM_MICRO - 1
            with torch.enable_grad() if last else model.no_sync():
                out = model(tokens[step, micro], position_ids, None, labels=labels[step, micro])
                loss = out.float().mean() / NUM_MICRO
                loss.backward()
            losses.append(loss.detach())
        finalize_model_grads([model])
        ok, norm, _ = opt.step()
        assert ok
        norms.append(norm)
    params = {}
    for name, p in model.module.named_parameters():
        params[name] = p.full_tensor() if hasattr(p, "full_tensor") else p.detach().clone()
    return torch.stack(losses), torch.tensor(norms), params, _state_bytes(model, opt)


def _state_bytes(model, opt) -> int:
    """Bytes of the storages behind this rank's params, grads and optimizer state (each
    storage once: a DTensor counts its local shard's storage, padding included)."""
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters()]
    tensors += [v for st in opt.optimizer.state.values() for v in st.values()]
    storages = {}
    for t in tensors:
        if torch.is_tensor(t) and t.dim() > 0:  # Adam's step counts are 0-dim
            local = t.to_local() if hasattr(t, "to_local") else t
            storages[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
    return sum(storages.values())


def _ddp(module):
    cfg = DistributedDataParallelConfig(use_distributed_optimizer=True)
    return DistributedDataParallel(config=module.config, ddp_config=cfg, module=module)


def _megatron_fsdp(strategy):
    def wrap(module):
        cfg = DistributedDataParallelConfig(
            use_megatron_fsdp=True,
            use_distributed_optimizer=True,
            data_parallel_sharding_strategy=strategy,
        )
        return FullyShardedDataParallel(module.config, cfg, module)

    return wrap


def _torch_fsdp2(module):
    return TorchFullyShardedDataParallel(
        module.config, TorchFullyShardedDataParallelConfig(), module
    )


def _compare(tp: int, wraps: dict) -> list[str]:
    ref_losses, ref_norms, ref_params, _ = _train(_ddp, tp)
    checked = []
    for label, wrap in wraps.items():
        losses, norms, params, state_bytes = _train(wrap, tp)
        torch.testing.assert_close(losses, ref_losses, rtol=1e-6, atol=1e-6, msg=label)
        torch.testing.assert_close(norms, ref_norms, rtol=1e-6, atol=1e-6, msg=label)
        assert params.keys() == ref_params.keys()
        for name, ref in ref_params.items():
            # the updates moved the params: an unchanged copy would not pass
            torch.testing.assert_close(params[name], ref, rtol=1e-6, atol=1e-6, msg=label + name)
        if label == "dp4:optim_grads_params":
            # fp32 param + grad + Adam's two moments, replicated: 16 bytes per element
            replicated = 16 * sum(p.numel() for p in ref_params.values())
            assert abs(state_bytes / (replicated / 4) - 1) < 0.10, (state_bytes, replicated)
        checked.append(f"tp{tp}:{label}")
    return checked


def _nan_on_one_shard_skips_every_rank():
    """A NaN in the last rank's grad shard makes the clipping norm NaN on every rank: the step
    (the training loop's NaN check, `step(check_grad_norm=True)`) is skipped everywhere."""
    model = _megatron_fsdp("optim_grads_params")(_gpt(1))
    config = OptimizerConfig(
        optimizer="adam", lr=1e-2, clip_grad=1.0, use_distributed_optimizer=True
    )
    opt = get_megatron_optimizer(config, [model])
    tokens, labels = _batches(ps.get_data_parallel_rank())
    model(
        tokens[0, 0], torch.arange(SEQ).expand(MBS, SEQ), None, labels=labels[0, 0]
    ).mean().backward()
    finalize_model_grads([model])
    if torch.distributed.get_rank() == torch.distributed.get_world_size() - 1:
        next(model.parameters()).grad.to_local().view(-1)[0] = float("nan")
    before = [p.to_local().clone() for p in model.parameters()]
    ok, norm, _ = opt.step(check_grad_norm=True)
    assert not ok and norm != norm, (ok, norm)
    for p, old in zip(model.parameters(), before):
        assert torch.equal(p.to_local(), old)


def _body():
    checked = []
    ps.initialize_model_parallel(1)
    _nan_on_one_shard_skips_every_rank()
    checked += _compare(1, {"dp4:optim_grads_params": _megatron_fsdp("optim_grads_params")})
    ps.destroy_model_parallel()
    ps.initialize_model_parallel(2)
    wraps = {s: _megatron_fsdp(s) for s in ("no_shard", "optim", "optim_grads")}
    wraps["optim_grads_params"] = _megatron_fsdp("optim_grads_params")
    wraps["torch_fsdp2"] = _torch_fsdp2
    checked += _compare(2, wraps)
    ps.destroy_model_parallel()
    return checked


def test_fsdp_strategies_match_ddp_with_distributed_optimizer():
    results = run_distributed(_body, world_size=4, timeout=240)
    assert all(len(r) == 6 for r in results)
