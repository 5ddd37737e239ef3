"""The Mamba-2 mixer: in_proj -> causal depthwise conv -> SSD scan -> gated RMSNorm -> out_proj.

Mirrors `megatron.core.ssm.mamba_mixer` (MambaMixer, MambaMixerSubmodules, ExtendedRMSNorm):
the same constructor, parameters (`in_proj`, `conv1d_weight`, `conv1d_bias`, `dt_bias`,
`A_log`, `D`, `norm`, `out_proj`), tensor-parallel split and checkpoint keys. Megatron runs the
scan in the compiled `mamba_ssm` / `causal_conv1d` kernels; here it is plain PyTorch
(`gigatron.core.ssm.ssd`), so a Mamba layer runs wherever PyTorch does.

Tensor parallelism (as Megatron): heads and B/C groups are split over TP ranks, each rank owning
whole groups and the heads that read them. in_proj is column-parallel and each rank's rows are
[z_r | x_r | B_r | C_r | dt_r] (its slice of each component); the conv, dt_bias, A_log, D and
the norm are split the same way; out_proj is row-parallel. Nothing else communicates: the gated
norm normalises within a group, which lives on one rank. Sequence parallelism is the linears'
(all-gather into in_proj, reduce-scatter out of out_proj). Checkpoints save in_proj.weight as
`in_proj.weight.{z,x,B,C,dt}` and the conv as `conv1d.{weight,bias}.{x,B,C}`, so they reshard.

Shapes: s: seq, b: micro-batch, h: hidden (d_model), d_inner = nheads * headdim,
nh: heads on this rank, p: headdim, ng: groups on this rank, n: state dim, w: d_conv.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gigatron.core import parallel_state
from gigatron.core.ssm.ssd import causal_conv1d, ssd_chunk_scan
from gigatron.core.ssm.utils import shard_sections, split_tensor_factory
from gigatron.core.tensor_parallel import get_cuda_rng_tracker
from gigatron.core.transformer.module import MegatronModule
from gigatron.core.transformer.spec_utils import ModuleSpec, build_module
from gigatron.core.transformer.utils import sharded_state_dict_default
from gigatron.core.utils import get_pg_rank, get_pg_size, make_sharded_tensors_for_checkpoint


@dataclass
class MambaMixerSubmodules:
    """Specs of the input and output projections."""

    in_proj: ModuleSpec | type = None
    out_proj: ModuleSpec | type = None


class ExtendedRMSNorm(nn.Module):
    """Gated, grouped RMSNorm of Mamba-2 (mamba_ssm's RMSNormGated, norm after the gate):
    y = rmsnorm_per_group(x * silu(z)) * weight, fp32 inside. x, z [..., d]; weight [d] split
    over TP (`sharded_state_dict` axis 0)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: int | None = None,
                 norm_before_gate: bool = False, device=None, dtype=None):  # fmt: skip
        super().__init__()
        if norm_before_gate:
            raise ValueError("ExtendedRMSNorm: norm_before_gate=True is not supported (Megatron "
                             "builds the Mamba norm with norm_before_gate=False)")  # fmt: skip
        self.eps = eps
        self.group_size = hidden_size if group_size is None else group_size
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.tp_group = None

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        if z is not None:
            x = x * F.silu(z.float())
        grouped = x.unflatten(-1, (-1, self.group_size))  # [..., groups, group_size]
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        return (grouped.flatten(-2) * self.weight.float()).to(dtype)

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        return make_sharded_tensors_for_checkpoint(
            self.state_dict(prefix="", keep_vars=True), prefix, {"weight": 0}, sharded_offsets,
            tp_group=self.tp_group, dp_cp_group=(metadata or {}).get("dp_cp_group"),
        )  # fmt: skip


def _skip_init(weight):  # the mixer initialises in_proj per component (CPU init)
    return weight


class MambaMixer(MegatronModule):
    """[s(/tp), b, h] -> (output [s(/tp), b, h], out_proj bias or None). Arguments as
    Megatron's; `pg_collection` defaults to parallel_state's TP / CP groups."""

    def __init__(
        self,
        config,
        submodules: MambaMixerSubmodules,
        d_model,
        d_conv=4,
        conv_init=None,
        expand=2,
        A_init_range=(1, 16),
        D_has_hdim=False,
        rmsnorm=True,
        norm_before_gate=False,
        dt_min=0.001,
        dt_max=0.1,
        dt_init="random",
        dt_scale=1.0,
        dt_init_floor=1e-4,
        bias=False,
        conv_bias=True,
        chunk_size=128,
        layer_number=None,
        pg_collection=None,
        pp_layer_offset: int = 0,
        name: str | None = None,
    ):
        super().__init__(config)
        self.d_model, self.d_conv, self.expand = d_model, d_conv, expand
        self.conv_init, self.D_has_hdim, self.rmsnorm = conv_init, D_has_hdim, rmsnorm
        self.norm_before_gate, self.chunk_size = norm_before_gate, chunk_size
        self.layer_number, self.pp_layer_offset = layer_number, pp_layer_offset
        self.d_state = config.mamba_state_dim
        self.headdim = config.mamba_head_dim
        self.ngroups = config.mamba_num_groups
        if config.mamba_num_heads is not None:
            self.nheads = config.mamba_num_heads
            self.d_inner = self.nheads * self.headdim
        else:
            self.d_inner = int(expand * d_model)
            self.nheads = self.d_inner // self.headdim
        tp_group = getattr(pg_collection, "tp", None) or (
            parallel_state.get_tensor_model_parallel_group()
        )
        cp_group = getattr(pg_collection, "cp", None) or parallel_state.get_context_parallel_group()
        self.tp_group = tp_group
        tp_size, self.tp_rank = get_pg_size(tp_group), get_pg_rank(tp_group)
        self._check(tp_size, get_pg_size(cp_group), bias, conv_bias, norm_before_gate)
        self.tp_size = tp_size
        self.nheads_local_tp = self.nheads // tp_size
        self.d_inner_local_tp = self.d_inner // tp_size
        self.ngroups_local_tp = self.ngroups // tp_size

        cpu_init = config.use_cpu_initialization and config.perform_initialization
        self.in_proj = build_module(
            submodules.in_proj,
            d_model,
            self.d_inner * 2 + 2 * self.ngroups * self.d_state + self.nheads,  # z x B C dt
            config=config,
            init_method=_skip_init if cpu_init else config.init_method,
            gather_output=False,
            bias=bias,
            skip_bias_add=False,
            is_expert=False,
            tp_comm_buffer_name="fc1",
            tp_group=tp_group,
        )
        device = self.in_proj.weight.device
        conv_dim = self.d_inner_local_tp + 2 * self.ngroups_local_tp * self.d_state  # x B C
        self.conv1d_weight = nn.Parameter(
            torch.empty(conv_dim, 1, d_conv, device=device, dtype=config.params_dtype)
        )
        dtype = config.params_dtype
        self.conv1d_bias = nn.Parameter(torch.empty(conv_dim, device=device, dtype=dtype))
        self.dt_bias = nn.Parameter(torch.empty(self.nheads_local_tp, device=device, dtype=dtype))
        self.A_log = nn.Parameter(torch.empty(self.nheads_local_tp, device=device))  # fp32
        self.D = nn.Parameter(
            torch.ones(self.d_inner_local_tp if D_has_hdim else self.nheads_local_tp, device=device)
        )  # fmt: skip  (fp32)
        for param in (self.conv1d_weight, self.conv1d_bias, self.dt_bias, self.A_log, self.D):
            param.tensor_model_parallel, param.partition_dim, param.partition_stride = True, 0, 1
        self.in_proj.weight.partition_sizes = self.in_proj_sections(local=True)
        self._init_params(A_init_range, (dt_min, dt_max, dt_init_floor), cpu_init)
        if rmsnorm:
            self.norm = ExtendedRMSNorm(
                self.d_inner_local_tp, eps=1e-5, group_size=self.d_inner // self.ngroups,
                device=device, dtype=config.params_dtype,
            )  # fmt: skip
            self.norm.weight.tensor_model_parallel, self.norm.weight.partition_dim = True, 0
            self.norm.weight.partition_stride = 1
            self.norm.tp_group = tp_group
        self.out_proj = build_module(
            submodules.out_proj,
            self.d_inner,
            d_model,
            config=config,
            init_method=config.output_layer_init_method,
            bias=bias,
            input_is_parallel=True,
            skip_bias_add=True,
            is_expert=False,
            tp_comm_buffer_name="fc2",
            tp_group=tp_group,
        )

    def _check(self, tp_size, cp_size, bias, conv_bias, norm_before_gate) -> None:
        """Megatron's asserts, as ValueErrors naming the fields."""
        rules = [
            (self.d_state > 0 and self.headdim > 0 and self.ngroups > 0 and self.nheads > 0,
             f"mamba_state_dim ({self.d_state}), mamba_head_dim ({self.headdim}), "
             f"mamba_num_groups ({self.ngroups}) and the head count ({self.nheads}) must be "
             "positive"),
            (self.d_inner == self.nheads * self.headdim,
             f"d_inner ({self.d_inner}) must be divisible by mamba_head_dim ({self.headdim})"),
            (self.nheads % tp_size == 0,
             f"the Mamba head count ({self.nheads}) must be divisible by "
             f"tensor_model_parallel_size ({tp_size})"),
            (self.ngroups % tp_size == 0,
             f"mamba_num_groups ({self.ngroups}) must be divisible by "
             f"tensor_model_parallel_size ({tp_size})"),
            (self.nheads % self.ngroups == 0,
             f"the Mamba head count ({self.nheads}) must be divisible by mamba_num_groups "
             f"({self.ngroups})"),
            (not bias and conv_bias and not norm_before_gate,
             "MambaMixer supports bias=False, conv_bias=True, norm_before_gate=False only "
             "(as Megatron)"),
            (cp_size == 1,
             f"context_parallel_size ({cp_size}) > 1 is not implemented for Mamba layers"),
        ]  # fmt: skip
        for ok, message in rules:
            if not ok:
                raise ValueError(f"MambaMixer: {message}")

    def in_proj_sections(self, local: bool = False) -> list[int]:
        """Row counts of [z, x, B, C, dt] in in_proj's weight (global, or this rank's)."""
        tp = self.tp_size if local else 1
        bc = self.ngroups * self.d_state // tp
        return [self.d_inner // tp, self.d_inner // tp, bc, bc, self.nheads // tp]

    def conv_sections(self, local: bool = False) -> list[int]:
        """Channel counts of [x, B, C] in the conv weight and bias (global, or this rank's)."""
        return self.in_proj_sections(local)[1:4]

    @torch.no_grad()
    def _init_params(self, A_init_range, dt_range, cpu_init: bool) -> None:
        """Megatron's inits. With CPU initialisation every parameter is drawn at full size and
        sliced per component, so any TP size starts from the same model (layout invariance);
        otherwise each rank draws its own slice under the model-parallel RNG, as Megatron."""
        dt_min, dt_max, dt_floor = dt_range
        if A_init_range[0] <= 0 or A_init_range[1] < A_init_range[0]:
            raise ValueError(f"MambaMixer: A_init_range {A_init_range} must be 0 < lo <= hi")
        tp, rank = (self.tp_size, self.tp_rank) if cpu_init else (1, 0)
        on = "cpu" if cpu_init else self.conv1d_weight.device
        full = (lambda n: n * self.tp_size) if cpu_init else (lambda n: n)
        conv_full = full(self.conv1d_weight.shape[0])

        def draw():
            if cpu_init:
                weight = torch.empty(sum(self.in_proj_sections()), self.d_model)
                self.config.init_method(weight)
                self.in_proj.weight.copy_(shard_sections(weight, self.in_proj_sections(), rank, tp))
            conv_w = torch.empty(conv_full, 1, self.d_conv, device=on)
            nn.init.kaiming_uniform_(conv_w, a=math.sqrt(5))
            bound = 1 / math.sqrt(self.d_conv)  # nn.Conv1d's bias init (fan_in = d_conv)
            conv_b = torch.empty(conv_full, device=on).uniform_(-bound, bound)
            if self.conv_init is not None:
                conv_w.uniform_(-self.conv_init, self.conv_init)
            conv = self.conv_sections() if cpu_init else [conv_full]
            self.conv1d_weight.copy_(shard_sections(conv_w, conv, rank, tp))
            self.conv1d_bias.copy_(shard_sections(conv_b, conv, rank, tp))
            log_lo, log_hi = math.log(dt_min), math.log(dt_max)
            u = torch.rand(full(self.nheads_local_tp), device=on)
            dt = torch.exp(u * (log_hi - log_lo) + log_lo).clamp(min=dt_floor)
            inv_dt = dt + torch.log(-torch.expm1(-dt))  # softplus(inv_dt) = dt
            self.dt_bias.copy_(inv_dt.chunk(tp)[rank])
            A = torch.empty(full(self.nheads_local_tp), device=on).uniform_(*A_init_range)
            self.A_log.copy_(torch.log(A).chunk(tp)[rank])

        if not self.config.perform_initialization:
            return
        if cpu_init:
            draw()
        else:
            with get_cuda_rng_tracker().fork():
                draw()

    def forward(self, hidden_states, inference_context=None, *, inference_params=None,
                packed_seq_params=None):  # fmt: skip
        """hidden_states [s(/tp), b, h] -> (out [s(/tp), b, h], bias). With a static
        `inference_context` the conv and SSM states live in its `key_value_memory_dict` under
        this layer's number: prefill fills them, later calls continue from them."""
        if packed_seq_params is not None:
            raise ValueError("MambaMixer: packed_seq_params (packed sequences) is not implemented")
        context = inference_context if inference_context is not None else inference_params
        zxBCdt, _ = self.in_proj(hidden_states)  # [s, b, in_proj rows / tp]
        conv_state = ssm_state = None
        if context is not None:
            conv_state, ssm_state = self._states(context, zxBCdt.shape[1], zxBCdt.dtype)
        y = self._ssm(zxBCdt, conv_state, ssm_state)  # [s, b, d_inner / tp]
        return self.out_proj(y)

    def _ssm(self, zxBCdt, conv_state=None, ssm_state=None) -> torch.Tensor:
        """[s, b, in_proj rows / tp] -> [s, b, d_inner / tp]: conv, scan, gate and norm."""
        seq, batch = zxBCdt.shape[:2]
        nh, p, ng, n = self.nheads_local_tp, self.headdim, self.ngroups_local_tp, self.d_state
        z, xBC, dt = zxBCdt.transpose(0, 1).split(
            [self.d_inner_local_tp, self.d_inner_local_tp + 2 * ng * n, nh], dim=-1
        )  # [b, s, ...]
        xBC = causal_conv1d(xBC.transpose(1, 2), self.conv1d_weight, self.conv1d_bias, conv_state)
        x, B, C = xBC.transpose(1, 2).split([self.d_inner_local_tp, ng * n, ng * n], dim=-1)
        dt = F.softplus(dt.float() + self.dt_bias.float())  # [b, s, nh]
        A = -torch.exp(self.A_log.float())  # [nh]
        D = self.D.view(nh, p) if self.D_has_hdim else self.D
        y, final_state = ssd_chunk_scan(
            x.reshape(batch, seq, nh, p), dt, A, B.reshape(batch, seq, ng, n),
            C.reshape(batch, seq, ng, n), chunk_size=self.chunk_size, D=D,
            initial_state=ssm_state,
        )  # fmt: skip
        if ssm_state is not None:
            ssm_state.copy_(final_state)
        y = y.reshape(batch, seq, self.d_inner_local_tp).transpose(0, 1)  # [s, b, d_inner / tp]
        z = z.transpose(0, 1)
        if self.rmsnorm:
            return self.norm(y, z)
        return (y.float() * F.silu(z.float())).to(y.dtype)

    def mamba_state_shapes_per_request(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(conv state [conv channels / tp, d_conv], SSM state [nh, p, n]) of one sequence."""
        return (self.conv1d_weight.shape[0], self.d_conv), (
            self.nheads_local_tp, self.headdim, self.d_state,
        )  # fmt: skip

    def _states(self, context, batch: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's (conv_state [b, c, w], ssm_state [b, nh, p, n] fp32), zeroed at the
        start of a sequence (sequence_len_offset 0)."""
        if self.layer_number is None:
            raise ValueError("MambaMixer: inference needs layer_number (the state's key)")
        memory = context.key_value_memory_dict
        states = memory.get(self.layer_number)
        if states is None or states[0].shape[0] != batch:
            conv_shape, ssm_shape = self.mamba_state_shapes_per_request()
            device = self.conv1d_weight.device
            states = (
                torch.zeros(batch, *conv_shape, device=device, dtype=dtype),
                torch.zeros(batch, *ssm_shape, device=device, dtype=torch.float32),
            )
            memory[self.layer_number] = states
        elif context.sequence_len_offset == 0:
            for state in states:
                state.zero_()
        return states

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None) -> dict:
        """Megatron's keys: TP-split own parameters, the conv under `conv1d.{weight,bias}`, and
        in_proj / conv split per component (`.z .x .B .C .dt` / `.x .B .C`)."""
        own: dict = {}
        self._save_to_state_dict(own, "", keep_vars=True)
        dp_cp_group = (metadata or {}).get("dp_cp_group")
        axis_map = {name: 0 for name in ("A_log", "dt_bias", "D", "conv1d_weight", "conv1d_bias")}
        out = make_sharded_tensors_for_checkpoint(
            own, prefix, axis_map, sharded_offsets, tp_group=self.tp_group, dp_cp_group=dp_cp_group
        )
        for name, module in self.named_children():
            out.update(sharded_state_dict_default(module, f"{prefix}{name}.", sharded_offsets,
                                                  metadata, tp_group=self.tp_group))  # fmt: skip
        for param, key in (("conv1d_weight", "conv1d.weight"), ("conv1d_bias", "conv1d.bias")):
            out[f"{prefix}{param}"].key = f"{prefix}{key}"
            out[f"{prefix}{param}"] = split_tensor_factory(
                out[f"{prefix}{param}"], self.conv_sections(local=True), ["x", "B", "C"], 0
            )
        out[f"{prefix}in_proj.weight"] = split_tensor_factory(
            out[f"{prefix}in_proj.weight"], self.in_proj_sections(local=True),
            ["z", "x", "B", "C", "dt"], 0,
        )  # fmt: skip
        return out
