"""Optimizer wrappers, param groups, grad scalers and clipping in one process (no DDP: grads
are read from `.grad`, as a Megatron optimizer does when `main_grad` is absent)."""

import math

import pytest
import torch

from gigatron.core.distributed import DistributedDataParallelConfig
from gigatron.core.optimizer import (
    ChainedOptimizer,
    ConstantGradScaler,
    DynamicGradScaler,
    Float16OptimizerWithFloat16Params,
    FP32Optimizer,
    OptimizerConfig,
    ParamKey,
    get_megatron_optimizer,
)
from gigatron.core.optimizer.clip_grads import count_zeros_fp32, get_grad_norm_fp32


def _mlp(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 4)
    )
    return m.to(dtype)


def _backward(model, step, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
    loss = torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y)
    (loss * scale).backward()


def test_param_groups_no_wd_for_bias_and_norms():
    model = _mlp()
    model[0].weight.is_embedding_or_output_parameter = True
    opt = get_megatron_optimizer(
        OptimizerConfig(lr=1e-3, min_lr=1e-5, weight_decay=0.1, decoupled_lr=5e-4), [model]
    )
    assert isinstance(opt, FP32Optimizer)
    by_param = {id(p): g for g in opt.param_groups for p in g["params"]}
    names = dict(model.named_parameters())
    for name, p in names.items():
        g = by_param[id(p)]
        no_wd = p.dim() == 1  # biases and LayerNorm weight/bias
        assert g["wd_mult"] == (0.0 if no_wd else 1.0), name
        assert g["weight_decay"] == (0.0 if no_wd else 0.1), name
        assert g["max_lr"] == (5e-4 if name == "0.weight" else 1e-3), name
        assert g["is_expert_parallel"] is False
    assert by_param[id(names["0.weight"])]["default_config"] is False
    assert by_param[id(names["3.weight"])]["default_config"] is True


def test_param_groups_overrides_and_legacy_conditions():
    model = _mlp()
    overrides = {ParamKey(name="3.*"): {"wd_mult": 0.5}}
    opt = get_megatron_optimizer(OptimizerConfig(lr=1e-3), [model], config_overrides=overrides)
    g = next(g for g in opt.param_groups if any(p is model[3].bias for p in g["params"]))
    assert g["wd_mult"] == 0.5  # config_overrides replaces the default bias rule
    opt = get_megatron_optimizer(
        OptimizerConfig(lr=1e-3, min_lr=1e-4),
        [model],
        no_weight_decay_cond=lambda n, p: n.startswith("0."),
        scale_lr_cond=lambda n, p: n.startswith("3."),
        lr_mult=2.0,
    )
    for name, p in model.named_parameters():
        g = next(g for g in opt.param_groups if any(q is p for q in g["params"]))
        assert g["wd_mult"] == (0.0 if name.startswith("0.") else 1.0), name
        assert g["max_lr"] == (2e-3 if name.startswith("3.") else 1e-3), name
        assert g["min_lr"] == pytest.approx(2e-4 if name.startswith("3.") else 1e-4), name


def test_fp32_optimizer_equals_torch_adamw_with_clipping():
    model, ref = _mlp(), _mlp()
    config = OptimizerConfig(lr=1e-2, weight_decay=0.1, clip_grad=0.05)
    opt = get_megatron_optimizer(config, [model])
    decay = [p for p in ref.parameters() if p.dim() > 1]
    no_decay = [p for p in ref.parameters() if p.dim() == 1]
    ref_opt = torch.optim.AdamW(
        [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": 0.1}],
        lr=1e-2,
    )
    for step in range(5):
        opt.zero_grad()
        ref_opt.zero_grad()
        _backward(model, step)
        _backward(ref, step)
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05).item()
        ref_opt.step()
        ok, norm, zeros = opt.step()
        assert ok and zeros is None
        assert norm == pytest.approx(ref_norm, rel=1e-6)
        assert norm > 0.05  # clipping was active
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


def test_fp32_optimizer_without_clip_returns_none_norm_and_counts_zeros():
    model = _mlp()
    opt = get_megatron_optimizer(
        OptimizerConfig(lr=1e-3, clip_grad=0.0, log_num_zeros_in_grad=True), [model]
    )
    _backward(model, 0)
    model[3].bias.grad[:2] = 0.0
    ok, norm, zeros = opt.step()
    assert ok and norm is None
    want = sum(int((p.grad == 0).sum()) for p in model.parameters())
    assert zeros == want >= 2


def test_bf16_keeps_fp32_main_params():
    model = _mlp(torch.bfloat16)
    ref = _mlp(torch.bfloat16).float()  # same (bf16-rounded) init, fp32 everywhere
    config = OptimizerConfig(lr=1e-2, bf16=True, params_dtype=torch.bfloat16, clip_grad=0.0)
    opt = get_megatron_optimizer(config, [model])
    assert isinstance(opt, Float16OptimizerWithFloat16Params)
    ref_opt = get_megatron_optimizer(OptimizerConfig(lr=1e-2, clip_grad=0.0), [ref])
    for step in range(5):
        opt.zero_grad()
        ref_opt.zero_grad()
        _backward(model, step, torch.bfloat16)
        # The fp32 twin steps with the very same (bf16) grads, so the main params must match it.
        for p, q in zip(model.parameters(), ref.parameters()):
            q.grad = p.grad.float()
        assert opt.step()[0] and ref_opt.step()[0]
    mains = [p.main_param for p in model.parameters()]
    assert all(m.dtype == torch.float32 for m in mains)
    assert all(s["exp_avg"].dtype == torch.float32 for s in opt.optimizer.state.values())
    for p, m, q in zip(model.parameters(), mains, ref.parameters()):
        torch.testing.assert_close(m, q, rtol=0, atol=1e-6)  # fp32 main == fp32 twin
        assert torch.equal(p, m.to(torch.bfloat16))  # model = bf16(main)
    # state_dict round trip restores main params and Adam state.
    sd = opt.state_dict()
    sd = torch.utils._pytree.tree_map(lambda t: t.clone() if torch.is_tensor(t) else t, sd)
    before = [m.clone() for m in mains]
    _backward(model, 9, torch.bfloat16)
    opt.step()
    opt.load_state_dict(sd)
    assert all(torch.equal(a, b) for a, b in zip(before, mains))


def test_constant_loss_scale_is_undone_before_the_step():
    model, ref = _mlp(torch.bfloat16), _mlp(torch.bfloat16)
    base = dict(lr=1e-2, bf16=True, params_dtype=torch.bfloat16, clip_grad=1.0)
    opt = get_megatron_optimizer(OptimizerConfig(loss_scale=8.0, **base), [model])
    ref_opt = get_megatron_optimizer(OptimizerConfig(**base), [ref])
    assert isinstance(opt.grad_scaler, ConstantGradScaler)
    assert opt.scale_loss(torch.tensor(2.0)).item() == 16.0
    _backward(model, 0, torch.bfloat16, scale=8.0)
    _backward(ref, 0, torch.bfloat16)
    ok, norm, _ = opt.step()
    ok_ref, norm_ref, _ = ref_opt.step()
    assert norm == pytest.approx(norm_ref, rel=1e-6)  # x8 is exact in bf16, and so is /8
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)


def test_fp16_dynamic_scaler_skips_overflow_and_backs_off():
    model = _mlp(torch.float16)
    config = OptimizerConfig(
        lr=1e-2, fp16=True, params_dtype=torch.float16, initial_loss_scale=256.0, hysteresis=2
    )
    opt = get_megatron_optimizer(config, [model])
    assert isinstance(opt.grad_scaler, DynamicGradScaler)
    scales = []
    for step in range(4):
        opt.zero_grad()
        model.zero_grad()
        _backward(model, step, torch.float16, scale=opt.get_loss_scale().item())
        if step in (1, 2):
            model[0].weight.grad[0, 0] = float("inf")
        before = [p.clone() for p in model.parameters()]
        ok, norm, zeros = opt.step()
        unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        assert ok is (step not in (1, 2)) and unchanged is (step in (1, 2)), step
        if not ok:
            assert norm is None and zeros is None
        scales.append(opt.get_loss_scale().item())
    # hysteresis=2: the first overflow only spends the tolerance, the second halves the scale.
    assert scales == [256.0, 256.0, 128.0, 128.0]


def test_dynamic_scaler_growth_and_state():
    s = DynamicGradScaler(4.0, 1.0, 2.0, 0.5, growth_interval=3, hysteresis=1)
    for _ in range(3):
        s.update(False)
    assert s.scale.item() == 8.0
    s.update(True)
    assert s.scale.item() == 4.0
    for _ in range(5):
        s.update(True)
    assert s.scale.item() == 1.0  # floored at min_scale
    t = DynamicGradScaler(4.0, 1.0, 2.0, 0.5, 3, 1)
    t.load_state_dict(s.state_dict())
    assert t.scale.item() == 1.0 and t._hysteresis_tracker == s._hysteresis_tracker
    with pytest.raises(ValueError, match="backoff_factor"):
        DynamicGradScaler(4.0, 1.0, 2.0, 1.5, 3, 1)


def test_grad_norm_helpers():
    a, b = torch.tensor([3.0, 0.0]), torch.tensor([4.0])
    assert get_grad_norm_fp32([a, b]) == pytest.approx(5.0)
    assert get_grad_norm_fp32([a, b], norm_type=math.inf) == pytest.approx(4.0)
    assert get_grad_norm_fp32([a, b], norm_type=1) == pytest.approx(7.0)
    p, q = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    p.grad, q.grad = a.clone(), torch.zeros(1)
    q.shared = True  # a tied copy: not counted
    assert count_zeros_fp32([p, q]) == 1


def test_shared_params_are_not_double_counted_in_norm():
    model = _mlp()
    opt = get_megatron_optimizer(OptimizerConfig(lr=1e-3, clip_grad=1e9), [model])
    _backward(model, 0)
    full = opt.get_grad_norm()
    model[3].weight.shared = True
    without = math.sqrt(full**2 - model[3].weight.grad.pow(2).sum().item())
    assert opt.get_grad_norm() == pytest.approx(without, rel=1e-6)


def test_expert_params_get_their_own_optimizer():
    model = _mlp()
    for p in model[3].parameters():
        p.allreduce = False  # expert-parallel params
    opt = get_megatron_optimizer(OptimizerConfig(lr=1e-3, clip_grad=1e9), [model])
    assert isinstance(opt, ChainedOptimizer) and len(opt.chained_optimizers) == 2
    assert all(g["is_expert_parallel"] for g in opt.chained_optimizers[1].param_groups)
    _backward(model, 0)
    want = math.sqrt(sum(p.grad.pow(2).sum().item() for p in model.parameters()))
    ok, norm, _ = opt.step()
    assert ok and norm == pytest.approx(want, rel=1e-6)


def test_config_errors():
    with pytest.raises(ValueError, match=r"OptimizerConfig.optimizer \('soap'\)"):
        OptimizerConfig(optimizer="soap")
    with pytest.raises(ValueError, match="fp16"):
        OptimizerConfig(fp16=True, bf16=True)
    with pytest.raises(ValueError, match="use_precision_aware_optimizer"):
        OptimizerConfig(use_precision_aware_optimizer=True)
    with pytest.raises(ValueError, match="requires use_distributed_optimizer"):
        OptimizerConfig(overlap_param_gather=True)
    with pytest.raises(ValueError, match=r"lr \(None\)"):
        get_megatron_optimizer(OptimizerConfig(), [_mlp()])
    with pytest.raises(ValueError, match=r"data_parallel_sharding_strategy \('zero3'\)"):
        DistributedDataParallelConfig(
            use_megatron_fsdp=True, data_parallel_sharding_strategy="zero3"
        )
    with pytest.raises(ValueError, match="megatron_fsdp_grad_comm_dtype"):
        DistributedDataParallelConfig(megatron_fsdp_grad_comm_dtype=torch.float16)
    with pytest.raises(ValueError, match="fsdp_double_buffer"):
        DistributedDataParallelConfig(use_megatron_fsdp=True, fsdp_double_buffer=True)
    with pytest.raises(ValueError, match="num_distributed_optimizer_instances"):
        DistributedDataParallelConfig(num_distributed_optimizer_instances=2)
    with pytest.raises(ValueError, match="overlap_param_gather"):
        DistributedDataParallelConfig(overlap_param_gather=True)
