"""MambaMixer at TP 2 (with and without sequence parallelism) against the same mixer on one
process, both built by layout-invariant CPU initialisation (so the TP-2 ranks hold the per-
component slices of the one-process weights): outputs, input grads and every weight grad (fp32);
and the checkpoint entries Megatron writes (in_proj split into z/x/B/C/dt, conv into x/B/C)."""

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from gigatron.core import parallel_state
from gigatron.core.dist_checkpointing.mapping import apply_factories
from gigatron.core.layout_invariant_init import init_rng_scope, set_layout_invariant_init_seed
from gigatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules
from gigatron.core.ssm.utils import shard_sections
from gigatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from gigatron.core.transformer import TransformerConfig
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank

S, Bt, H, HEADS, P, G, N = 8, 2, 32, 8, 8, 2, 16
TOL = dict(rtol=1e-5, atol=1e-5)
SPEC = MambaMixerSubmodules(in_proj=ColumnParallelLinear, out_proj=RowParallelLinear)


def _mixer(tp, sp, pg=None):
    cfg = TransformerConfig(
        num_layers=1, hidden_size=H, num_attention_heads=4, mamba_num_heads=HEADS,
        mamba_head_dim=P, mamba_num_groups=G, mamba_state_dim=N, add_bias_linear=False,
        use_cpu_initialization=True, tensor_model_parallel_size=tp, sequence_parallel=sp,
    )  # fmt: skip
    with init_rng_scope(cfg, "mixer"):
        return MambaMixer(cfg, SPEC, d_model=H, chunk_size=4, pg_collection=pg)


def _local_slice(name, full, ref):
    """This rank's slice of a one-process parameter (or grad) `full` named `name`."""
    rank = parallel_state.get_tensor_model_parallel_rank()
    if name == "in_proj.weight":
        return shard_sections(full, ref.in_proj_sections(), rank, 2)
    if name.startswith("conv1d"):
        return shard_sections(full, ref.conv_sections(), rank, 2)
    if name == "out_proj.weight":
        return full.chunk(2, dim=1)[rank]
    return full.chunk(2)[rank]


def _run_tp2_parity():
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    rank = dist.get_rank()
    singles = [dist.new_group([r]) for r in range(2)]
    set_layout_invariant_init_seed(7)
    ref = _mixer(1, False, SimpleNamespace(tp=singles[rank], cp=singles[rank]))
    g = torch.Generator().manual_seed(1)
    x, grad = torch.randn(S, Bt, H, generator=g), torch.randn(S, Bt, H, generator=g)
    x_ref = x.clone().requires_grad_()
    y_ref, _ = ref(x_ref)
    y_ref.backward(grad)
    ref_params = dict(ref.named_parameters())
    for sp in (False, True):
        ours = _mixer(2, sp)
        for name, param in ours.named_parameters():  # the same model, sliced per component
            torch.testing.assert_close(param, _local_slice(name, ref_params[name], ref), rtol=0,
                                       atol=0, msg=name)  # fmt: skip
        x_in = (x.chunk(2)[rank] if sp else x).clone().requires_grad_()
        y, _ = ours(x_in)
        y.backward(grad.chunk(2)[rank] if sp else grad)
        y_full = torch.cat([t for t in _all_gather(y)]) if sp else y
        torch.testing.assert_close(y_full, y_ref, **TOL)
        x_grad_ref = x_ref.grad.chunk(2)[rank] if sp else x_ref.grad
        torch.testing.assert_close(x_in.grad, x_grad_ref, **TOL)
        for name, param in ours.named_parameters():
            expected = _local_slice(name, ref_params[name].grad, ref)
            torch.testing.assert_close(param.grad, expected, **TOL, msg=name)
    sharded = ours.sharded_state_dict(prefix="decoder.layers.0.mixer.")
    apply_factories(sharded)
    set_layout_invariant_init_seed(None)
    entries = {}
    for value in sharded.values():
        for t in value if isinstance(value, list) else [value]:
            entries[t.key] = (t.global_shape, t.global_offset)
    return entries


def _all_gather(t):
    out = [torch.empty_like(t) for _ in range(2)]
    dist.all_gather(out, t.contiguous())
    return out


def test_tp2_and_sp_equal_one_process_and_checkpoint_keys_are_megatrons():
    per_rank = run_distributed(_run_tp2_parity, 2)
    prefix = "decoder.layers.0.mixer."
    entries = per_rank[1]
    d_inner, bc = HEADS * P, G * N
    expected = {
        "in_proj.weight.z": ((d_inner, H), (d_inner // 2, 0)),
        "in_proj.weight.x": ((d_inner, H), (d_inner // 2, 0)),
        "in_proj.weight.B": ((bc, H), (bc // 2, 0)),
        "in_proj.weight.C": ((bc, H), (bc // 2, 0)),
        "in_proj.weight.dt": ((HEADS, H), (HEADS // 2, 0)),
        "conv1d.weight.x": ((d_inner, 1, 4), (d_inner // 2, 0, 0)),
        "conv1d.bias.B": ((bc,), (bc // 2,)),
        "A_log": ((HEADS,), (HEADS // 2,)),
        "D": ((HEADS,), (HEADS // 2,)),
        "dt_bias": ((HEADS,), (HEADS // 2,)),
        "norm.weight": ((d_inner,), (d_inner // 2,)),
        "out_proj.weight": ((H, d_inner), (0, d_inner // 2)),
    }
    for key, (shape, offset) in expected.items():
        assert entries[prefix + key] == (shape, offset), key
    saved = sorted(k for k in entries if "_extra_state" not in k)
    assert saved == sorted(prefix + k for k in ALL), saved


ALL = [f"in_proj.weight.{p}" for p in ("z", "x", "B", "C", "dt")] + [
    f"conv1d.{w}.{p}" for w in ("weight", "bias") for p in ("x", "B", "C")
] + ["A_log", "D", "dt_bias", "norm.weight", "out_proj.weight"]  # fmt: skip
