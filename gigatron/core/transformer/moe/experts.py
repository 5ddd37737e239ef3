"""The experts of an MoE layer: a list of MLPs, or all of them as one grouped GEMM.

Mirrors `megatron.core.transformer.moe.experts`:
- `SequentialMLP`: `num_local_experts` MLPs (`is_expert=True`, expert-TP group, expert RNG
  stream for init) run one after the other on their slice of the permuted tokens.
- `GroupedMLP`: Megatron's (legacy) grouped-GEMM experts with the same parameter layout:
  `weight1 [h, n_local * f/etp (x2 for GLU)]`, `weight2 [n_local * f/etp, h]`, viewed per expert
  as `[n_local, h, f/etp]` / `[n_local, f/etp, h]`. The GEMM is `torch._grouped_mm` where it
  runs (torch >= 2.8, CPU or CUDA, 16-byte aligned rows) and a per-expert matmul loop otherwise.
  Unlike Megatron's it also runs in fp32 and on CPU; it has no bias (as Megatron's).
Both take the routing probs and apply them after the activation (`act(x W1) * p`), so the
dispatcher's combine is a plain sum. Weight converters between the two layouts:
`grouped_weights_from_sequential` / `sequential_weights_from_grouped`.

Checkpoints (megatron-core 0.16's `sharded_state_dict`): experts are keyed globally, local
expert j of EP rank r being global expert e = r * n_local + j of E. SequentialMLP saves expert
e's entries under `<prefix>experts.<name>` (prefix ending in `mlp.experts.`, hence Megatron's
`mlp.experts.experts.linear_fc1.weight`) with a prepended expert axis (e of E); GroupedMLP saves
weight1 / weight2 transposed into the same global tensors ([E, glu*f, h] / [E, h, f] after the
layer axis), so the two load each other's checkpoints, at any EP x ETP. Replicas are over the
expert-DP group. GroupedMLP's optimizer state keeps the weights' memory layout
(`<prefix>weight1` [E, h, glu, f], `weight2` [E, f, h]): a distributed optimizer's flat range
of a weight is a flat range there, not of the transposed tensors (as in Megatron, the
optimizer state of the two modules is not interchangeable).

Shapes: N: tokens routed to this rank's experts (grouped by expert), h: hidden, f: expert ffn
(`moe_ffn_hidden_size`), etp: expert tensor-parallel size.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import torch
from torch import Tensor
from torch.nn import Parameter

from gigatron.compat import missing_names
from gigatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
from gigatron.core.dist_checkpointing.utils import replace_prefix_for_sharding
from gigatron.core.tensor_parallel.layers import _initialize_affine_weight_gpu  # Megatron's path
from gigatron.core.tensor_parallel.random import CheckpointWithoutOutput
from gigatron.core.transformer.mlp import MLP, MLPSubmodules, glu_activation
from gigatron.core.transformer.module import MegatronModule
from gigatron.core.transformer.moe import moe_utils
from gigatron.core.transformer.moe.fp8_experts import fp8_grouped_mlp
from gigatron.core.utils import (
    group_rank,
    group_size,
    make_sharded_object_for_checkpoint,
    parameter_device,
)


def _expert_config(config):
    """A config whose ffn_hidden_size is the expert size (MLP reads ffn_hidden_size)."""
    if config.moe_ffn_hidden_size == config.ffn_hidden_size:
        return config
    cfg = copy.copy(config)
    cfg.ffn_hidden_size = config.moe_ffn_hidden_size
    return cfg


class SequentialMLP(MegatronModule):
    """`num_local_experts` expert MLPs run one by one; `local_experts.{i}.linear_fc1.weight`."""

    def __init__(
        self,
        num_local_experts: int,
        config,
        submodules: MLPSubmodules,
        pg_collection=None,
        name=None,
    ):
        super().__init__(_expert_config(config))
        if pg_collection is None:
            pg_collection = moe_utils.get_default_pg_collection()
        self.num_local_experts = num_local_experts
        self.ep_group, self.tp_group = pg_collection.ep, pg_collection.expt_tp
        self.dp_group = pg_collection.expt_dp

        def build():
            return MLP(
                self.config,
                submodules,
                ffn_hidden_size=self.config.moe_ffn_hidden_size,
                is_expert=True,
                tp_group=self.tp_group,
            )

        ep_size, ep_rank = group_size(self.ep_group), group_rank(self.ep_group)
        if self.config.use_cpu_initialization and self.config.perform_initialization:
            # CPU init draws every expert in global order and keeps this rank's: any EP layout
            # then starts from the same experts (gigatron; Megatron repeats EP rank 0's).
            first = ep_rank * num_local_experts
            experts = []
            for e in range(num_local_experts * ep_size):
                expert = build()
                if first <= e < first + num_local_experts:
                    experts.append(expert)
        else:
            experts = [build() for _ in range(num_local_experts)]
        self.local_experts = torch.nn.ModuleList(experts)

    def forward(
        self,
        permuted_local_hidden_states: Tensor,
        tokens_per_expert: Tensor,
        permuted_probs: Tensor,
    ):
        """[N, h] grouped by local expert, counts [n_local], probs [N] -> ([N, h] partial over
        etp, None)."""
        counts = tokens_per_expert.tolist()
        outputs = []
        for expert, x, p in zip(
            self.local_experts,
            torch.split(permuted_local_hidden_states, counts),
            torch.split(permuted_probs, counts),
        ):
            out, bias = expert(x, p)  # probs scale act(fc1) inside the MLP
            if bias is not None:  # Megatron: an expert's fc2 bias is weighted by the prob too
                out = out + bias * p.unsqueeze(-1).to(out.dtype)
            outputs.append(out)
        return torch.cat(outputs, dim=0), None

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """Each local expert's MLP entries under the global expert key and axis (module
        docstring); replica ids (pp, tp, expert-DP rank)."""
        n, dp_rank = self.num_local_experts, group_rank(self.dp_group)
        first = group_rank(self.ep_group) * n
        num_experts = n * group_size(self.ep_group)
        out = {}
        for j, expert in enumerate(self.local_experts):
            local_prefix = f"{prefix}local_experts.{j}."
            offsets = (*sharded_offsets, (len(sharded_offsets), first + j, num_experts))
            sharded = expert.sharded_state_dict(local_prefix, offsets, metadata)
            replace_prefix_for_sharding(sharded, local_prefix, f"{prefix}experts.")
            for sh in sharded.values():
                sh.replica_id = (*sh.replica_id[:2], dp_rank)
            out.update(sharded)
        return out


def grouped_mm_available(x: Tensor, w: Tensor) -> bool:
    """Whether `torch._grouped_mm` can run these operands: present in this torch, same dtype,
    and row strides that are multiples of 16 bytes (the kernel's alignment rule; CPU and CUDA).
    Inside a compiled graph only bf16 (the kernel's meta function, which tracing runs, follows
    the CUDA kernel's dtype rule even on CPU)."""
    if not hasattr(torch, "_grouped_mm") or x.dtype != w.dtype:
        return False
    if x.is_cuda:  # CUDA kernel: bf16 on Hopper or newer
        if x.dtype != torch.bfloat16 or not _hopper_or_newer(x.device.index):
            return False
    elif x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16):
        return False
    if x.dtype != torch.bfloat16 and torch.compiler.is_compiling():
        return False
    size = x.element_size()
    return all((d * size) % 16 == 0 for d in (x.shape[-1], w.shape[-1], w.shape[-2]))


@torch.compiler.assume_constant_result
def _hopper_or_newer(index: int | None) -> bool:
    """Compute capability >= 9 (a constant to torch.compile: no graph break)."""
    return torch.cuda.get_device_capability(index)[0] >= 9


def grouped_gemm(x: Tensor, w: Tensor, tokens_per_expert: Tensor, use_kernel: bool | None = None):
    """Row block i of x [N, a] (tokens_per_expert[i] rows) times w[i] [a, c] -> [N, c].

    `use_kernel=None` picks `torch._grouped_mm` when available (its offsets are computed on
    device: no host sync). Otherwise eager loops over the experts' row blocks (the counts read on
    the host), and a compiled graph, which must not read them, computes every expert's product
    on all rows and keeps each row's own (n times the FLOPs: a fallback for tests and odd
    dtypes, static shapes).
    """
    if use_kernel is None:
        use_kernel = grouped_mm_available(x, w)
    if use_kernel:
        offs = torch.cumsum(tokens_per_expert.to(x.device), dim=0).to(torch.int32)
        return torch._grouped_mm(x, w, offs=offs)
    if torch.compiler.is_compiling():
        ends = torch.cumsum(tokens_per_expert.to(x.device), dim=0)  # [n]
        rows = torch.arange(x.shape[0], device=x.device)
        expert = torch.bucketize(rows, ends, right=True)  # [N]: the expert of each row
        out = x.new_zeros(x.shape[0], w.shape[-1])
        for i in range(w.shape[0]):
            out = torch.where((expert == i).unsqueeze(-1), x @ w[i], out)
        return out
    chunks = torch.split(x, tokens_per_expert.tolist())
    return torch.cat([c @ w[i] for i, c in enumerate(chunks)], dim=0)


class GroupedMLP(MegatronModule):
    """All local experts as two grouped GEMMs (layout in the module docstring)."""

    sync_free = True  # the counts stay on device (MoELayer.sync_free)

    def __init__(
        self, num_local_experts: int, config, pg_collection=None, submodules=None, name=None
    ):
        super().__init__(_expert_config(config))
        cfg = self.config
        if pg_collection is None:
            pg_collection = moe_utils.get_default_pg_collection()
        if cfg.add_bias_linear:
            raise ValueError(
                "GroupedMLP has no bias: set add_bias_linear=False or use SequentialMLP "
                "(moe_grouped_gemm=False) (experts.py)"
            )
        self.num_local_experts = num_local_experts
        self.ep_group, self.tp_group = pg_collection.ep, pg_collection.expt_tp
        self.dp_group = pg_collection.expt_dp
        self.expert_parallel = cfg.expert_model_parallel_size > 1
        self.activation_func = cfg.activation_func
        tp_size, tp_rank = group_size(self.tp_group), group_rank(self.tp_group)
        glu = 2 if cfg.gated_linear_unit else 1
        h, f = cfg.hidden_size, cfg.moe_ffn_hidden_size
        if f % tp_size:
            raise ValueError(
                f"moe_ffn_hidden_size ({f}) must be divisible by expert_tensor_parallel_size "
                f"({tp_size}) (experts.py)"
            )
        fc1_out, fc2_in = glu * f * num_local_experts, f * num_local_experts
        device = parameter_device(cfg)
        self.weight1 = Parameter(
            torch.empty(h, fc1_out // tp_size, device=device, dtype=cfg.params_dtype)
        )
        self.weight2 = Parameter(
            torch.empty(fc2_in // tp_size, h, device=device, dtype=cfg.params_dtype)
        )
        if cfg.perform_initialization:
            if cfg.use_cpu_initialization:
                self._init_cpu_like_sequential(tp_size, tp_rank)
            else:  # on the expert-parallel RNG stream: each EP rank draws its own experts
                _initialize_affine_weight_gpu(self.weight1, cfg.init_method, 1, is_expert=True)
                _initialize_affine_weight_gpu(
                    self.weight2, cfg.output_layer_init_method, 0, is_expert=True
                )
        for w, dim in ((self.weight1, 1), (self.weight2, 0)):
            w.allreduce = not self.expert_parallel
            w.tensor_model_parallel, w.partition_dim, w.partition_stride = True, dim, 1
        # gigatron.core.fp8_utils.Fp8Recipe: the expert GEMMs in FP8 (set by the transformer block)
        self.fp8_recipe = None
        # `sharded_state_dict` adds SequentialMLP's per-expert `_extra_state` objects (so either
        # module loads the other's checkpoint); a load through `load_state_dict` ignores them.
        self.register_load_state_dict_post_hook(_ignore_extra_states)

    def _init_cpu_like_sequential(self, tp_size: int, tp_rank: int) -> None:
        """Draw each expert's full fc1 [glu*f, h] and fc2 [h, f] in global expert order, exactly
        as SequentialMLP's CPU init does, and keep this rank's experts and expert-TP shards: the
        same seed gives the same experts in both layouts and in every EP x ETP layout."""
        cfg, n = self.config, self.num_local_experts
        glu = 2 if cfg.gated_linear_unit else 1
        h, f = cfg.hidden_size, cfg.moe_ffn_hidden_size
        f_rank = f // tp_size
        first = group_rank(self.ep_group) * n
        fc1, fc2 = [], []
        for e in range(n * group_size(self.ep_group)):
            w1 = torch.empty(glu * f, h)
            cfg.init_method(w1)
            w2 = torch.empty(h, f)
            cfg.output_layer_init_method(w2)
            if first <= e < first + n:  # rows [gate_r; up_r] and columns r of the ffn dim
                fc1.append(torch.cat(torch.split(w1, f_rank, dim=0)[tp_rank::tp_size], dim=0))
                fc2.append(torch.split(w2, f_rank, dim=1)[tp_rank])
        w1, w2 = grouped_weights_from_sequential(fc1, fc2)
        with torch.no_grad():
            self.weight1.copy_(w1.to(cfg.params_dtype))
            self.weight2.copy_(w2.to(cfg.params_dtype))

    def forward(
        self,
        permuted_local_hidden_states: Tensor,
        tokens_per_expert: Tensor,
        permuted_probs: Tensor,
    ):
        """[N, h] grouped by local expert, counts [n_local], probs [N] -> ([N, h], None)."""
        h, n = self.config.hidden_size, self.num_local_experts
        x = permuted_local_hidden_states
        w1 = self.weight1.view(n, h, -1)  # [n, h, glu*f/etp]
        w2 = self.weight2.view(n, -1, h)  # [n, f/etp, h]
        if self.fp8_recipe is not None:
            return fp8_grouped_mlp(self, x, w1, w2, tokens_per_expert, permuted_probs), None
        fc1 = grouped_gemm(x, w1, tokens_per_expert)  # [N, glu*f/etp]
        c = self.config
        if (
            c.recompute_granularity == "selective"
            and "moe_act" in c.recompute_modules
            and self.training
            and torch.is_grad_enabled()
        ):  # recompute "moe_act": the activation's output is freed and refilled at backward
            ckpt = CheckpointWithoutOutput()
            act = ckpt.checkpoint(self._weighted_activation, fc1, permuted_probs)
            out = grouped_gemm(act, w2, tokens_per_expert)  # [N, h]
            ckpt.discard_output_and_register_recompute(out)
            return out, None
        act = self._weighted_activation(fc1, permuted_probs)  # [N, f/etp]
        return grouped_gemm(act, w2, tokens_per_expert), None

    def _weighted_activation(self, fc1: Tensor, probs: Tensor) -> Tensor:
        """fc1 [N, glu*f/etp], probs [N] -> act(fc1) * probs [N, f/etp] in fc1's dtype."""
        if self.config.gated_linear_unit:
            act = glu_activation(fc1, self.config, self.activation_func)
        else:
            act = self.activation_func(fc1)
        return (act * probs.unsqueeze(-1)).to(fc1.dtype)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """weight1 / weight2 as factories saving SequentialMLP's global expert tensors
        (transposed per expert; module docstring), plus its `_extra_state` objects."""
        n, h = self.num_local_experts, self.config.hidden_size
        ep_rank, ep_size = group_rank(self.ep_group), group_size(self.ep_group)
        tp_rank, tp_size = group_rank(self.tp_group), group_size(self.tp_group)
        dp_rank = group_rank(self.dp_group)
        glu = self.config.gated_linear_unit
        f_local = self.weight2.numel() // n // h  # f/etp
        p = len(sharded_offsets)
        ep_box = (p, ep_rank, ep_size)

        @torch.no_grad()
        def build(key, t, replica_id, flattened_range, fc1: bool):
            if fc1:  # [h, n*X] -> [n, X, h], X = glu*f/etp; GLU: [gate_r | up_r] -> 2 boxes
                t = t.view(n, h, -1).transpose(1, 2)
                halves = torch.chunk(t, 2, dim=1) if glu else (t,)
                frags = 2 * tp_size if glu else tp_size
                boxes = [(p + 1, k * tp_size + tp_rank, frags) for k in range(len(halves))]
            else:  # [n*f/etp, h] -> [n, h, f/etp]
                halves, boxes = (
                    (t.view(n, f_local, h).transpose(1, 2),),
                    [(p + 2, tp_rank, tp_size)],
                )
            return [
                ShardedTensor.from_rank_offsets(
                    key,
                    half.contiguous(),
                    *sharded_offsets,
                    ep_box,
                    box,
                    replica_id=replica_id,
                    prepend_axis_num=p,
                )  # fmt: skip
                for half, box in zip(halves, boxes)
            ]

        @torch.no_grad()
        def merge(pieces, fc1: bool):
            t = torch.cat(pieces, dim=1).transpose(1, 2)  # [n, h, X] / [n, f/etp, h]
            return t.reshape(h, -1) if fc1 else t.reshape(-1, h)

        out = {}
        for name, fc1 in (("weight1", True), ("weight2", False)):
            weight = getattr(self, name)
            # the weight itself (no transpose), the layout of its optimizer state (module
            # docstring): weight1 [n, h, glu, f/etp] (a rank's columns are [gate_r | up_r]),
            # weight2 [n, f/etp, h]; the expert-TP piece along f, so any ETP reads it
            if fc1:
                view, box = weight.view(n, h, 2 if glu else 1, f_local), (p + 3, tp_rank, tp_size)
            else:
                view, box = weight.view(n, f_local, h), (p + 1, tp_rank, tp_size)
            out[f"{prefix}{name}"] = _GroupedWeightFactory(
                f"{prefix}experts.linear_fc{1 if fc1 else 2}.weight",
                weight,
                functools.partial(build, fc1=fc1),
                functools.partial(merge, fc1=fc1),
                (0, 0, dp_rank),
                parameter_boxes=(view, (*sharded_offsets, ep_box, box), name),
            )
        for j in range(n):
            e = ep_rank * n + j
            offsets = (*sharded_offsets, (p, e, n * ep_size))
            for mod in ("linear_fc1", "linear_fc2"):
                out[f"{prefix}expert{e}.{mod}._extra_state"] = make_sharded_object_for_checkpoint(
                    None, f"{prefix}experts.{mod}._extra_state", offsets, (0, tp_rank, dp_rank)
                )
        return out


@dataclasses.dataclass
class _GroupedWeightFactory(ShardedTensorFactory):
    """GroupedMLP's weight factory, which also describes the weight as it lies in memory,
    for optimizer state that must follow the parameter's flat order (`parameter_layout`)."""

    parameter_boxes: tuple = ()  # (view [n, ...] of the weight, rank offsets, module name)

    def parameter_layout(self) -> list[ShardedTensor]:
        """The weight in memory order: `<prefix>mlp.experts.weight1` [*L, E, h, glu, f] /
        `weight2` [*L, E, f, h], this rank's experts and expert-TP piece (one box; a view)."""
        view, offsets, name = self.parameter_boxes
        key = self.key.rsplit("experts.linear_fc", 1)[0] + name
        p = len(offsets) - 2
        return [
            ShardedTensor.from_rank_offsets(
                key, view, *offsets, replica_id=self.replica_id, prepend_axis_num=p
            )
        ]


def _ignore_extra_states(module, incompatible_keys) -> None:
    """Load post-hook: `_extra_state` entries GroupedMLP has no module for are not errors."""
    unexpected = incompatible_keys.unexpected_keys
    unexpected[:] = [k for k in unexpected if "_extra_state" not in k]


def grouped_weights_from_sequential(fc1_weights: list[Tensor], fc2_weights: list[Tensor]):
    """Per-expert nn.Linear weights (fc1 [glu*f, h], fc2 [h, f]; one TP shard each) ->
    (weight1 [h, n*glu*f], weight2 [n*f, h]) in GroupedMLP's layout."""
    w1 = torch.stack([w.t() for w in fc1_weights]).reshape(fc1_weights[0].shape[1], -1)
    w2 = torch.stack([w.t() for w in fc2_weights]).reshape(-1, fc2_weights[0].shape[0])
    return w1.contiguous(), w2.contiguous()


def sequential_weights_from_grouped(weight1: Tensor, weight2: Tensor, num_local_experts: int):
    """Inverse of `grouped_weights_from_sequential` -> (fc1 list, fc2 list)."""
    h = weight1.shape[0]
    w1 = weight1.reshape(num_local_experts, h, -1)
    w2 = weight2.reshape(num_local_experts, -1, h)
    return [w.t().contiguous() for w in w1], [w.t().contiguous() for w in w2]


# tutorials' names (MoEMLP, Router, ...) say what to use (gigatron.compat.missing_names)
__getattr__ = missing_names.module_getattr(__name__)
