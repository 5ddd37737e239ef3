"""The Mamba-2 state-space scan (SSD) and its causal depthwise convolution, in plain PyTorch.

Megatron calls the compiled `mamba_ssm` (`mamba_chunk_scan_combined`) and `causal_conv1d`
packages for these; gigatron computes the same math with tensor ops only, so any device
PyTorch runs on (CPU included) runs a Mamba layer. The scan has no data-dependent control flow
and static shapes, which lets `torch.compile` fuse it.

The recurrence (Dao & Gu 2024, "Transformers are SSMs", state space duality), per head h with
state S_t [p, n]:

    S_t = exp(dt_t * A_h) * S_{t-1} + dt_t * x_t B_t^T        y_t = S_t C_t + D_h * x_t

`ssd_sequential` runs it step by step (the reference); `ssd_chunk_scan` splits the sequence into
chunks of Q steps: inside a chunk the output is a masked (decay-weighted) C.B^T product applied
to dt*x (the "attention-like" quadratic form), across chunks only the chunk-end states pass on.

Shapes: b: batch, l: sequence, h: heads, p: head dim, g: B/C groups, k = h / g heads per group,
n: state dim, c: chunks, Q: chunk length, d: conv channels, w: conv kernel width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    conv_state: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal depthwise convolution, SiLU applied (Mamba's short convolution).

    x [b, d, l]; weight [d, 1, w]; bias [d]; conv_state [b, d, w] or None: the last w inputs
    before x (zeros at the start), updated in place to the last w inputs of [state, x].
    Returns [b, d, l]: out_t = silu(bias + sum_j weight[:, 0, j] * x_{t - w + 1 + j}).
    """
    width = weight.shape[-1]
    seq_len = x.shape[-1]
    if conv_state is None:
        history = F.pad(x, (width - 1, 0))  # [b, d, w - 1 + l]
    else:
        history = torch.cat([conv_state[..., 1:].to(x.dtype), x], dim=-1)
        conv_state.copy_(torch.cat([conv_state, x], dim=-1)[..., -width:])
    out = F.conv1d(history, weight, bias, groups=x.shape[1])  # [b, d, l]
    assert out.shape[-1] == seq_len
    return F.silu(out)


def _heads_by_group(t: torch.Tensor, num_groups: int, dim: int = -1) -> torch.Tensor:
    """Split the heads dim h into [g, k] (h = g * k, group-major as Mamba-2 orders them)."""
    return t.unflatten(dim, (num_groups, -1))


def ssd_chunk_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    chunk_size: int,
    D: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked SSD scan, fp32 inside.

    x [b, l, h, p]; dt [b, l, h] (after bias and softplus); A [h] (negative); B, C [b, l, g, n];
    D [h] or [h, p] or None; initial_state [b, h, p, n] or None (zeros).
    Returns (y [b, l, h, p] in x's dtype, final_state [b, h, p, n] fp32).
    """
    dtype = x.dtype
    batch, seq_len, heads, head_dim = x.shape
    groups = B.shape[2]
    pad = (-seq_len) % chunk_size
    x, dt, B, C = (F.pad(t.float(), (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, dt, B, C))
    num_chunks = x.shape[1] // chunk_size

    def chunks(t):  # [b, l, ...] -> [b, c, Q, ...]
        return t.reshape(batch, num_chunks, chunk_size, *t.shape[2:])

    # Padded steps have dt = 0: no decay and no input, so the final state is exact.
    xdt = chunks(_heads_by_group(x * dt[..., None], groups, dim=2))  # [b, c, Q, g, k, p]
    B, C = chunks(B), chunks(C)  # [b, c, Q, g, n]
    dA = chunks(dt * A.float())  # [b, c, Q, h]
    dA_cum = torch.cumsum(dA, dim=2)  # [b, c, Q, h]: log decay from chunk start to step l

    # 1. within each chunk: y_l = sum_{s <= l} (C_l . B_s) exp(cum_l - cum_s) dt_s x_s
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device).tril()
    log_decay = dA_cum[:, :, :, None, :] - dA_cum[:, :, None, :, :]  # [b, c, l, s, h]
    decay = torch.where(causal[:, :, None], log_decay, float("-inf")).exp()
    scores = torch.einsum("bclgn,bcsgn->bclsg", C, B)  # [b, c, l, s, g]
    weights = _heads_by_group(decay, groups) * scores[..., None]  # [b, c, l, s, g, k]
    y = torch.einsum("bclsgk,bcsgkp->bclgkp", weights, xdt)

    # 2. each chunk's own contribution to its end state: sum_s exp(cum_end - cum_s) dt_s x_s B_s
    to_end = _heads_by_group((dA_cum[:, :, -1:] - dA_cum).exp(), groups)  # [b, c, Q, g, k]
    chunk_states = torch.einsum("bcsgn,bcsgk,bcsgkp->bcgkpn", B, to_end, xdt)

    # 3. pass states across chunks: start state of chunk c = sum_{c' < c} decay(c' -> c) * own c'
    if initial_state is None:
        initial_state = x.new_zeros(batch, heads, head_dim, B.shape[-1])
    init = initial_state.float().reshape(batch, 1, groups, heads // groups, head_dim, -1)
    states = torch.cat([init, chunk_states], dim=1)  # [b, c + 1, g, k, p, n]
    chunk_log = F.pad(dA_cum[:, :, -1], (0, 0, 1, 0))  # [b, c + 1, h]: chunk 0 = initial state
    chunk_cum = torch.cumsum(chunk_log, dim=1)
    across = chunk_cum[:, :, None, :] - chunk_cum[:, None, :, :]  # [b, to, from, h]
    later = torch.ones(num_chunks + 1, num_chunks + 1, dtype=torch.bool, device=x.device).tril()
    across = torch.where(later[:, :, None], across, float("-inf")).exp()
    states = torch.einsum("bzcgk,bcgkpn->bzgkpn", _heads_by_group(across, groups), states)
    start_states, final_state = states[:, :-1], states[:, -1]

    # 4. the start state read out inside each chunk: y_l += exp(cum_l) C_l . S_start
    from_start = _heads_by_group(dA_cum.exp(), groups)  # [b, c, Q, g, k]
    y = y + torch.einsum("bclgn,bclgk,bcgkpn->bclgkp", C, from_start, start_states)

    y = y.reshape(batch, num_chunks * chunk_size, heads, head_dim)[:, :seq_len]
    if D is not None:
        y = y + _skip_weight(D) * x[:, :seq_len]
    return y.to(dtype), final_state.reshape(batch, heads, head_dim, -1)


def _skip_weight(D: torch.Tensor) -> torch.Tensor:
    """D [h] or [h, p] (Megatron's D_has_hdim) -> broadcastable to [..., h, p], fp32."""
    return D.float()[:, None] if D.dim() == 1 else D.float()


def ssd_sequential(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    D: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same scan one step at a time (the reference, and single-token decoding).

    Arguments and returns as `ssd_chunk_scan`.
    """
    batch, seq_len, heads, head_dim = x.shape
    repeat = heads // B.shape[2]
    B = B.float().repeat_interleave(repeat, dim=2)  # [b, l, h, n]
    C = C.float().repeat_interleave(repeat, dim=2)
    state = (
        initial_state.float()
        if initial_state is not None
        else x.new_zeros(batch, heads, head_dim, B.shape[-1], dtype=torch.float32)
    )  # [b, h, p, n]
    outputs = []
    for t in range(seq_len):
        dt_t = dt[:, t].float()  # [b, h]
        x_t = x[:, t].float()  # [b, h, p]
        decay = torch.exp(dt_t * A.float())[..., None, None]  # [b, h, 1, 1]
        state = decay * state + (dt_t[..., None] * x_t)[..., None] * B[:, t, :, None, :]
        y_t = torch.einsum("bhpn,bhn->bhp", state, C[:, t])
        if D is not None:
            y_t = y_t + _skip_weight(D) * x_t
        outputs.append(y_t)
    return torch.stack(outputs, dim=1).to(x.dtype), state
