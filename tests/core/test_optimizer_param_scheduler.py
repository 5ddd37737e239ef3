"""OptimizerParamScheduler: every lr / wd style against closed-form values, and its state dict."""

import math

import pytest
import torch

from gigatron.core.optimizer_param_scheduler import (
    OptimizerParamScheduler,
    get_canonical_lr_for_logging,
)

INIT, MAX, MIN, W, D = 0.0, 1.0e-3, 1.0e-5, 10, 100


def _opt(groups=1):
    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(groups)]
    return torch.optim.SGD([{"params": [p]} for p in params], lr=0.0)


def _sched(style, opt=None, **kw):
    args = dict(
        init_lr=INIT,
        max_lr=MAX,
        min_lr=MIN,
        lr_warmup_steps=W,
        lr_decay_steps=D,
        lr_decay_style=style,
        start_wd=0.1,
        end_wd=0.1,
        wd_incr_steps=D,
        wd_incr_style="constant",
    )
    args.update(kw)
    return OptimizerParamScheduler(opt or _opt(), **args)


def _closed_form(style, n, wsd_steps=20, wsd_style="linear"):
    if n <= W:
        return INIT + (MAX - INIT) * n / W
    if style == "constant":
        return MAX
    if n > D:
        return MIN
    if style == "inverse-square-root":
        return max(MIN, MAX * math.sqrt(W) / math.sqrt(n))
    r = (n - W) / (D - W)
    if style == "linear":
        c = 1 - r
    elif style == "cosine":
        c = 0.5 * (math.cos(math.pi * r) + 1)
    else:
        start = D - wsd_steps
        if n <= start:
            c = 1.0
        else:
            q = (n - start) / wsd_steps
            c = {
                "linear": 1 - q,
                "cosine": 0.5 * (math.cos(math.pi * q) + 1),
                "exponential": 2 * 0.5**q - 1,
                "minus_sqrt": 1 - math.sqrt(q),
            }[wsd_style]
    return MIN + c * (MAX - MIN)


STEPS = [0, 1, 5, 10, 11, 37, 50, 79, 80, 81, 95, 99, 100, 101, 250]


@pytest.mark.parametrize("style", ["constant", "linear", "cosine", "inverse-square-root"])
def test_lr_styles(style):
    s = _sched(style)
    n = 0
    for target in STEPS:
        s.step(target - n)
        n = target
        lr = s.optimizer.param_groups[0]["lr"]
        assert lr == pytest.approx(_closed_form(style, n), rel=1e-12, abs=1e-15), (style, n)


@pytest.mark.parametrize("wsd_style", ["linear", "cosine", "exponential", "minus_sqrt"])
def test_wsd(wsd_style):
    s = _sched("WSD", wsd_decay_steps=20, lr_wsd_decay_style=wsd_style)
    for n in range(0, 120):
        assert s.optimizer.param_groups[0]["lr"] == pytest.approx(
            _closed_form("WSD", n, 20, wsd_style), rel=1e-12, abs=1e-15
        ), n
        s.step(1)
    # Spot values: stable at max until step 80, min at the end.
    s.num_steps = 0
    s.step(80)
    assert s.optimizer.param_groups[0]["lr"] == pytest.approx(MAX)
    s.step(20)
    assert s.optimizer.param_groups[0]["lr"] == pytest.approx(MIN)


def test_hand_values():
    s = _sched("cosine")
    s.step(5)
    assert s.optimizer.param_groups[0]["lr"] == pytest.approx(5e-4)
    s.step(50)  # n = 55: r = 0.5, cos(pi/2) = 0 -> halfway between max and min
    assert s.optimizer.param_groups[0]["lr"] == pytest.approx((MAX + MIN) / 2)
    s = _sched("linear")
    s.step(55)
    assert s.optimizer.param_groups[0]["lr"] == pytest.approx((MAX + MIN) / 2)
    s = _sched("inverse-square-root")
    s.step(40)  # sqrt(10/40) = 1/2
    assert s.optimizer.param_groups[0]["lr"] == pytest.approx(MAX / 2)


@pytest.mark.parametrize("wd_style", ["constant", "linear", "cosine"])
def test_wd_styles_and_wd_mult(wd_style):
    start, end = (0.1, 0.1) if wd_style == "constant" else (0.0, 0.2)
    opt = _opt(2)
    opt.param_groups[1]["wd_mult"] = 0.0  # the no-weight-decay group (biases, norms)
    s = _sched("linear", opt, start_wd=start, end_wd=end, wd_incr_steps=40, wd_incr_style=wd_style)
    for n in range(0, 60):
        r = min(n, 40) / 40
        coeff = {"constant": 0.0, "linear": r, "cosine": 0.5 * (math.cos(math.pi * (1 - r)) + 1)}
        want = start + coeff[wd_style] * (end - start) if n <= 40 else end
        assert opt.param_groups[0]["weight_decay"] == pytest.approx(want, abs=1e-15), n
        assert opt.param_groups[1]["weight_decay"] == 0.0
        s.step(1)


def test_group_overrides():
    opt = _opt(2)
    opt.param_groups[1]["max_lr"] = 2 * MAX
    opt.param_groups[1]["min_lr"] = 0.0
    s = _sched("linear", opt)
    s.step(100)
    assert opt.param_groups[0]["lr"] == pytest.approx(MIN)
    assert opt.param_groups[1]["lr"] == pytest.approx(0.0)
    s.num_steps = 0
    s.step(10)
    assert opt.param_groups[1]["lr"] == pytest.approx(2 * MAX)


def test_validation_errors():
    with pytest.raises(ValueError, match=r"lr_warmup_steps \(100\) must be < lr_decay_steps"):
        _sched("linear", lr_warmup_steps=100)
    with pytest.raises(ValueError, match="wsd_decay_steps"):
        _sched("WSD")
    with pytest.raises(ValueError, match="lr_decay_style"):
        _sched("exp")
    with pytest.raises(ValueError, match=r"max_lr .* must be >= min_lr"):
        _sched("linear", max_lr=1e-6)
    with pytest.raises(ValueError, match="mutually exclusive"):
        _sched("linear", override_opt_param_scheduler=True)


def test_state_dict_roundtrip_and_checks():
    s = _sched("cosine")
    s.step(42)
    sd = s.state_dict()
    assert sd["num_steps"] == 42 and sd["lr_decay_style"] == "cosine"
    t = _sched("cosine")
    t.load_state_dict(sd)
    assert t.num_steps == 42
    assert t.optimizer.param_groups[0]["lr"] == s.optimizer.param_groups[0]["lr"]
    # use_checkpoint=True takes the checkpoint's values...
    u = _sched("linear", max_lr=2e-3)
    u.load_state_dict(sd)
    assert u.max_lr == MAX and u.lr_decay_style == "cosine"
    # ...False demands they match; override keeps the class values.
    v = _sched("linear", use_checkpoint_opt_param_scheduler=False)
    with pytest.raises(ValueError, match="do not match"):
        v.load_state_dict(sd)
    o = _sched(
        "linear",
        max_lr=2e-3,
        use_checkpoint_opt_param_scheduler=False,
        override_opt_param_scheduler=True,
    )
    o.load_state_dict(sd)
    assert o.max_lr == 2e-3 and o.lr_decay_style == "linear" and o.num_steps == 42
    # Legacy key names.
    legacy = {
        "start_lr": MAX,
        "min_lr": MIN,
        "warmup_iter": W,
        "end_iter": D,
        "decay_style": "cosine",
        "num_iters": 7,
    }
    w = _sched("cosine")
    w.load_state_dict(legacy)
    assert w.num_steps == 7


def test_canonical_lr_for_logging():
    opt = _opt(2)
    opt.param_groups[0]["default_config"] = False
    opt.param_groups[0]["max_lr"] = 5 * MAX
    opt.param_groups[1]["default_config"] = True
    s = _sched("constant", opt)
    s.step(W)
    assert get_canonical_lr_for_logging(opt.param_groups) == pytest.approx(MAX)
    assert get_canonical_lr_for_logging([{"lr": 1.0}]) is None
