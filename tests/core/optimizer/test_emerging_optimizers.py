"""Muon and Lion in one process against a transcription of NVIDIA's `emerging_optimizers`
(`_muon_reference.py`): Newton-Schulz per coefficient set and precision, the scale modes, a
Muon / Lion step through `get_megatron_optimizer` (2-D weights on Muon / Lion, the rest on
AdamW), QKV split on a GPT model, bf16 main params, checkpoint round trip, bad values."""

import copy

import pytest
import torch

from gigatron.core.optimizer import ChainedOptimizer, OptimizerConfig, get_megatron_optimizer
from gigatron.core.optimizer._newton_schulz import get_muon_scale_factor, newton_schulz
from gigatron.core.optimizer.emerging_optimizers import Lion, TensorParallelMuon
from tests._one_rank import one_rank_fixtures
from tests.core.optimizer import _muon_reference as ref
from tests.core.optimizer._gpt_tiny import tiny_gpt

gloo_world, single_rank = one_rank_fixtures()


def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 24), torch.nn.LayerNorm(24), torch.nn.GELU(), torch.nn.Linear(24, 4)
    )


def _backward(model, step):
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)
    torch.nn.functional.mse_loss(model(x), y).backward()


STEPS = {"quintic": 5, "simple": 7, "polar_express": 10}  # polar_express: last set repeated


@pytest.mark.parametrize("kind", ["quintic", "simple", "polar_express"])
@pytest.mark.parametrize("shape", [(12, 40), (40, 12)])
@pytest.mark.parametrize("precision", ["highest", "medium"])
def test_newton_schulz_equals_reference(kind, shape, precision):
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        out = newton_schulz(g, STEPS[kind], kind)
    finally:
        torch.set_float32_matmul_precision(prev)
    expected = ref.newton_schulz(g, STEPS[kind], kind, medium=precision == "medium")
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    # singular values pushed towards 1 (the point of the iteration)
    sv = torch.linalg.svdvals(out)
    assert 0.5 < sv.min() and sv.max() < 1.5


@pytest.mark.parametrize("mode", ["spectral", "unit_rms_norm", "shape_scaling"])
def test_scale_modes(mode):
    for out, inp in ((96, 32), (32, 96)):
        assert get_muon_scale_factor(out, inp, mode) == pytest.approx(ref.scale(out, inp, mode))


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(muon_nesterov=True, muon_scale_mode="unit_rms_norm", muon_extra_scale_factor=0.2),
        dict(muon_momentum=0.8, muon_coefficient_type="polar_express", muon_num_ns_steps=8),
    ],
)
def test_muon_two_steps_equal_reference(options):
    """2-D weights on Muon, biases / LayerNorm on AdamW with no decay, 1e-6 after two steps."""
    cfg = dict(lr=1e-2, weight_decay=0.1, clip_grad=0.0, muon_fp32_matmul_prec="highest", **options)
    config = OptimizerConfig(optimizer="muon", **cfg)
    model, twin = _mlp(), _mlp()
    opt = get_megatron_optimizer(config, [model])
    assert isinstance(opt, ChainedOptimizer)
    kinds = {type(o.optimizer) for o in opt.chained_optimizers}
    assert kinds == {TensorParallelMuon, torch.optim.AdamW}
    matrices = [n for n, p in twin.named_parameters() if p.dim() == 2]
    others = [p for n, p in twin.named_parameters() if n not in matrices]
    adam = torch.optim.AdamW(others, lr=1e-2, weight_decay=0.0)
    bufs = {n: torch.zeros_like(p) for n, p in twin.named_parameters() if n in matrices}
    ns = dict(kind=config.muon_coefficient_type, steps=config.muon_num_ns_steps)
    for step in range(2):
        for m in (model, twin):
            _backward(m, step)
        assert opt.step()[0]
        opt.zero_grad()
        adam.step()
        with torch.no_grad():
            for name, p in twin.named_parameters():
                if name in matrices:
                    new, bufs[name] = ref.muon_step(
                        p,
                        p.grad,
                        bufs[name],
                        lr=1e-2,
                        wd=0.1,
                        momentum=config.muon_momentum,
                        nesterov=config.muon_nesterov,
                        mode=config.muon_scale_mode,
                        extra=config.muon_extra_scale_factor,
                        **ns,
                    )
                    p.copy_(new)
        twin.zero_grad()
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=f"step {step}: {name}")


def _twin_steps(model, twin, opt, rule, steps=2, lr=1e-3):
    """Step `model` with `opt` and `twin` with `rule(name, p, state, wd)` for the params it
    claims (returns False for the rest: AdamW, no decay on 1-D, as Megatron's groups)."""
    state = {n: torch.zeros_like(p) for n, p in twin.named_parameters()}
    claimed = {n for n, p in twin.named_parameters() if rule(n, p, None, None) is not False}
    others = [p for n, p in twin.named_parameters() if n not in claimed]
    decay = [p for p in others if p.dim() == 2]
    adam = torch.optim.AdamW(
        [dict(params=decay), dict(params=[p for p in others if p.dim() != 2], weight_decay=0.0)],
        lr=lr,
        weight_decay=0.1,
    )
    for step in range(steps):
        for m in (model, twin):
            _backward(m, step)
        assert opt.step()[0]
        opt.zero_grad()
        adam.step()
        with torch.no_grad():
            for name, p in twin.named_parameters():
                if name in claimed:
                    new, state[name] = rule(name, p, state[name], 0.1 if p.dim() == 2 else 0.0)
                    p.copy_(new)
        twin.zero_grad()
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=f"step {step}: {name}")
    return claimed


@pytest.mark.parametrize("where", ["optimizer", "muon_scalar_optimizer"])
def test_lion_two_steps_equal_reference(where):
    """`optimizer='lion'`: 2-D weights on Lion (lion_beta1/2), the rest on AdamW; with
    `muon_scalar_optimizer='lion'` the non-matrix params are Lion's and the matrices Muon's."""
    if where == "optimizer":
        extra = dict(optimizer="lion")
    else:
        extra = dict(
            optimizer="muon", muon_scalar_optimizer="lion", muon_fp32_matmul_prec="highest"
        )
    config = OptimizerConfig(
        lr=1e-3, weight_decay=0.1, clip_grad=0.0, lion_beta1=0.9, lion_beta2=0.97, **extra
    )
    model, twin = _mlp(), _mlp()
    opt = get_megatron_optimizer(config, [model])
    assert Lion in {type(o.optimizer) for o in opt.chained_optimizers}

    def rule(name, p, m, wd):
        on_lion = (p.dim() == 2) == (where == "optimizer")
        if m is None:
            return True if on_lion or where != "optimizer" else False
        if on_lion:
            return ref.lion_step(p, p.grad, m, lr=1e-3, wd=wd, beta1=0.9, beta2=0.97)
        return ref.muon_step(p, p.grad, m, lr=1e-3, wd=wd, momentum=config.muon_momentum)

    claimed = _twin_steps(model, twin, opt, rule)
    assert claimed == set(dict(twin.named_parameters())) or where == "optimizer"


def test_muon_state_dict_round_trip_resumes_identically():
    """A Muon + AdamW optimizer saved after one step and loaded into a fresh one (momentum
    buffers and Adam moments) steps like the original."""
    config = OptimizerConfig(optimizer="muon", lr=1e-2, muon_fp32_matmul_prec="highest")
    model = _mlp()
    opt = get_megatron_optimizer(config, [model])
    _backward(model, 0)
    opt.step()
    opt.zero_grad()
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    bufs = [s["momentum_buffer"] for s in saved_opt[0]["state"].values()]
    assert bufs and all(b.abs().sum() > 0 for b in bufs)
    _backward(model, 1)
    opt.step()
    resumed = _mlp(seed=5)
    resumed.load_state_dict(saved_model)
    opt2 = get_megatron_optimizer(config, [resumed])
    opt2.load_state_dict(saved_opt)
    _backward(resumed, 1)
    opt2.step()
    for p, q in zip(model.parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_bf16_muon_keeps_qkv_tags_on_main_params():
    """bf16 params: Muon steps fp32 main copies, which carry the QKV / TP tags."""
    model = tiny_gpt().bfloat16()
    config = OptimizerConfig(optimizer="muon", lr=1e-2, bf16=True)
    opt = get_megatron_optimizer(config, [model])
    muon = next(o for o in opt.chained_optimizers if isinstance(o.optimizer, TensorParallelMuon))
    mains = [p for g in muon.optimizer.param_groups for p in g["params"]]
    assert all(p.dtype == torch.float32 for p in mains)
    qkv = [p for p in mains if getattr(p, "is_qkv", False)]
    assert len(qkv) == model.config.num_layers
    assert all(p.qkv_split_shapes == [16, 8, 8] for p in qkv)
    ids = torch.randint(0, 64, (2, 8))
    model(ids, None, None, labels=ids).float().mean().backward()
    before = [p.detach().clone() for p in model.parameters()]
    assert opt.step()[0]
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_qkv_split_update_equals_reference():
    """A GQA model's fused QKV weight: Q, K and V rows orthogonalised as three matrices."""
    model = tiny_gpt()
    config = OptimizerConfig(
        optimizer="muon", lr=1e-2, weight_decay=0.0, clip_grad=0.0, muon_fp32_matmul_prec="highest"
    )
    opt = get_megatron_optimizer(config, [model])
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    model(ids, None, None, labels=ids).mean().backward()
    qkv = model.decoder.layers[0].self_attention.linear_qkv.weight
    w, g = qkv.detach().clone(), qkv.grad.clone()
    opt.step()
    update = ref.muon_qkv_update((1 - 0.95) * g, [16, 8, 8], steps=5, kind="quintic")
    torch.testing.assert_close(qkv.detach(), w - 1e-2 * update, rtol=0, atol=1e-6)
    unsplit = w - 1e-2 * ref.scale(*w.shape) * ref.newton_schulz((1 - 0.95) * g)
    assert (qkv.detach() - unsplit).abs().max() > 1e-4  # the split changes the update


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("muon_num_ns_steps", 0, "num_ns_steps must be at least 1"),
        ("muon_coefficient_type", "cubic", "Unsupported muon coefficient type 'cubic'"),
        ("muon_scale_mode", "rms", "muon_scale_mode .'rms'. must be one of"),
        ("muon_tp_mode", "sharded", "muon_tp_mode .'sharded'. must be one of"),
        ("muon_scalar_optimizer", "sgd", "muon_scalar_optimizer .'sgd'. must be one of"),
        ("fp16", True, "emerging optimizer with fp16 is not supported"),
    ],
)
def test_bad_muon_values_raise_when_the_optimizer_is_built(field, value, match):
    config = OptimizerConfig(optimizer="muon", lr=1e-2, **{field: value})
    with pytest.raises(ValueError, match=match):
        get_megatron_optimizer(config, [_mlp()])


def test_unknown_optimizer_is_refused_by_the_config():
    with pytest.raises(ValueError, match="optimizer .'soap'. must be one of"):
        OptimizerConfig(optimizer="soap", lr=1e-3)
