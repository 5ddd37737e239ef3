"""FP8 delayed scaling (tensor_parallel/fp8_delayed.py, Megatron's default `--fp8-recipe
delayed`): over several steps of an FP8 linear, every scale equals the one a plain reference
computes from Transformer Engine's definition (the amaxes of the last `amax_history_len` steps,
`max` or `most_recent`, fp8_max / 2**margin / amax), the forward and input-gradient GEMMs cast
with those stored scales (not the tensors' own amaxes, saturating what outgrew them), and the
state round-trips through `_extra_state` bytes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("torchao.float8")

from gigatron.core.fp8_utils import get_fp8_recipe  # noqa: E402
from gigatron.core.tensor_parallel.fp8_delayed import (  # noqa: E402
    Fp8DelayedState,
    load_extra,
    state_to_extra,
    update_delayed_scaling,
)
from gigatron.core.tensor_parallel.fp8_linear import Fp8LinearFunction, delayed_args  # noqa: E402

N, H, F_OUT = 16, 32, 24  # tokens, in features, out features
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _rand(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _ref_scale(amaxes, algo, history_len, fp8_dtype, margin, old):
    """Transformer Engine's DelayedScaling scale after the update that saw `amaxes[-1]`."""
    window = amaxes[-history_len:]
    amax = max(window) if algo == "max" else window[-1]
    if amax <= 0:
        return old
    fp8_max = torch.tensor(torch.finfo(fp8_dtype).max, dtype=torch.float32) * 2.0**-margin
    return (fp8_max / torch.tensor(amax, dtype=torch.float32)).item()


def _dequant(t, scale, dtype):
    """What an FP8 cast with `scale` keeps of `t`, back in fp32 (saturating, as TE casts)."""
    fp8_max = torch.finfo(dtype).max
    return (t.float() * scale).clamp(-fp8_max, fp8_max).to(dtype).float() / scale


@pytest.mark.parametrize("algo, history_len, margin", [("max", 3, 1), ("most_recent", 2, 0)])
def test_scales_and_gemms_follow_te_delayed_scaling(algo, history_len, margin):
    cfg = SimpleNamespace(
        fp8="hybrid", fp8_recipe="delayed", fp8_margin=margin, fp8_wgrad=True,
        fp8_amax_history_len=history_len, fp8_amax_compute_algo=algo,
    )  # fmt: skip
    recipe = get_fp8_recipe(cfg)
    state = Fp8DelayedState(history_len)
    seen = {0: [], 1: [], 2: []}  # role -> amax per step
    scales = [1.0, 1.0, 1.0]  # the reference's, TE's initial scale
    w0 = _rand(0, F_OUT, H) * 0.2
    # magnitudes that rise and fall, so the window and the saturation both matter
    for step, mag in enumerate([1.0, 4.0, 0.5, 0.25, 2.0]):
        x = (_rand(10 + step, N, H) * mag).requires_grad_(True)
        w = (w0 * (1 + 0.3 * step)).requires_grad_(True)
        g = _rand(20 + step, N, F_OUT) * mag
        args = (recipe, "column", False, False, False, None, delayed_args(state))
        y = Fp8LinearFunction.apply(x, w, None, *args)
        update_delayed_scaling([state], recipe, forward=True)  # the block's forward exit
        y.backward(g)
        update_delayed_scaling([state], recipe, forward=False)  # after the block's backward

        sx, sw, sg = scales
        xd, wd, gd = _dequant(x, sx, E4M3), _dequant(w, sw, E4M3), _dequant(g, sg, E5M2)
        torch.testing.assert_close(y.detach(), xd @ wd.t(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x.grad, gd @ wd, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(w.grad, gd.t() @ xd, rtol=1e-5, atol=1e-5)

        for role, t in enumerate((x, w, g)):
            seen[role].append(t.detach().abs().max().item())
            dtype = E5M2 if role == 2 else E4M3
            scales[role] = _ref_scale(seen[role], algo, history_len, dtype, margin, scales[role])
        assert state.scale.tolist() == scales, (step, state.scale.tolist(), scales)
        assert state.amax_history[0].tolist() == [0.0, 0.0, 0.0]  # row 0 zeroed by the roll


def test_state_round_trips_through_extra_state_bytes():
    state = Fp8DelayedState(4)
    state.amax_history.copy_(torch.rand(4, 3))
    state.scale.copy_(torch.rand(3) * 100)
    extra = state_to_extra(state)
    assert extra.dtype == torch.uint8 and b"amax_history_fwd" in extra.numpy().tobytes()
    again = Fp8DelayedState(4)
    load_extra(again, extra)
    assert torch.equal(again.amax_history, state.amax_history)
    assert torch.equal(again.scale, state.scale)
    with pytest.raises(ValueError, match="fp8_amax_history_len"):
        load_extra(Fp8DelayedState(2), extra)
