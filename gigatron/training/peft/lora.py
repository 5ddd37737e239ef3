"""LoRA on Megatron's linear layers, tensor-parallel (Megatron-Bridge's `megatron.bridge.peft.lora`:
`LoRA(target_modules, dim, alpha, dropout)` applied to a model, `LoRAMerge` folding it back).

Every targeted ColumnParallelLinear / RowParallelLinear gets an `adapter` child (keys
`<layer>.adapter.linear_in.weight` [r, in] and `<layer>.adapter.linear_out.weight` [out, r], as
Bridge names them) whose output, times alpha / dim, is added to the layer's:

    y = W x + (alpha / dim) * B (A dropout(x))         A = linear_in, B = linear_out

The adapter is sharded as its base layer (s: seq, b: micro-batch, r: rank, tp: TP size):

    column-parallel W [o/tp, h]:  A [r, h] whole     -> h_r = A x [s(/tp), b, r]
                                  copy to TP region (gather over the sequence under SP)
                                  B [o/tp, r] rows   -> [s, b, o/tp], this rank's columns
    row-parallel    W [o, h/tp]:  A [r, h/tp] cols   -> partial A x [s, b, r]
                                  all-reduce (reduce-scatter over the sequence under SP)
                                  B [o, r] whole     -> [s(/tp), b, o], as the layer's output

so the merged weight of each rank is its base shard plus its shard of B A. The whole matrices
(A, B) are drawn from a generator seeded by the layer's global name: every layout starts from the
same adapter. Under sequence parallelism the whole matrix that sees a sequence slice (A of a
column layer, B of a row layer) is marked `sequence_parallel`, so finalize_model_grads
all-reduces its gradient over TP as it does the layer norms'.

The model's state dict (and sharded state dict) holds the base weights only, so base checkpoints
load into an adapted model and save from it unchanged; adapters are saved apart
(`adapter_io.save_adapters`).

Differences from Bridge: the base layer keeps its module and keys (Bridge wraps it as
`to_wrap`); expert layers are adapted only at expert-TP 1; `dropout_position` is "pre" only.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from gigatron.core.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    get_cuda_rng_tracker,
    set_tensor_model_parallel_attributes,
)
from gigatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)
from gigatron.core.utils import group_rank, group_size, unwrap_model

TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass
class LoRA:
    """Megatron-Bridge's LoRA config; calling it on a model (or a list of model chunks)
    freezes every base parameter and adds the adapters (the only trainable parameters)."""

    target_modules: list[str] = field(default_factory=lambda: list(TARGETS))
    """Linear layers to adapt, by module name (Bridge's: linear_qkv, linear_proj, linear_fc1,
    linear_fc2)."""
    dim: int = 32
    """LoRA rank r."""
    alpha: int = 32
    """Scale numerator: the update is alpha / dim * B A."""
    dropout: float = 0.0
    """Dropout on the adapter's input."""
    dropout_position: str = "pre"
    """Where dropout applies; gigatron has "pre" (on the input) only."""
    lora_A_init_method: str = "xavier"
    """"xavier" (uniform) or "kaiming" (uniform, a = sqrt(5))."""
    lora_B_init_method: str = "zero"
    """"zero" (the adapted model starts as the base) or "normal" (std 0.02, for tests)."""
    seed: int = 0
    """Seed of the adapters' initial values (with each layer's global name)."""

    def __post_init__(self) -> None:
        bad = [t for t in self.target_modules if t not in TARGETS]
        if bad or not self.target_modules:
            raise ValueError(f"LoRA target_modules {self.target_modules}: each one of {TARGETS}")
        if self.dim < 1:
            raise ValueError(f"LoRA dim ({self.dim}) must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoRA dropout ({self.dropout}) must be in [0, 1)")
        if self.dropout_position != "pre":
            raise ValueError(f"LoRA dropout_position {self.dropout_position!r}: gigatron has 'pre'")
        if self.lora_A_init_method not in ("xavier", "kaiming"):
            raise ValueError(
                f"LoRA lora_A_init_method {self.lora_A_init_method!r}: xavier | kaiming"
            )
        if self.lora_B_init_method not in ("zero", "normal"):
            raise ValueError(f"LoRA lora_B_init_method {self.lora_B_init_method!r}: zero | normal")

    def __call__(self, model, training: bool = True):
        """Freeze `model` (a module or a list of chunks) and adapt its target layers; returns it."""
        for chunk in model if isinstance(model, list) else [model]:
            for p in chunk.parameters():
                p.requires_grad_(False)
            for name, module in list(chunk.named_modules()):
                if name.rsplit(".", 1)[-1] in self.target_modules and not hasattr(
                    module, "adapter"
                ):
                    _attach(module, global_name(name, module_of=chunk), self)
            chunk.train(training)
        return model


def lora_from_args(args) -> LoRA | None:
    """The LoRA of `gigatron train`'s --lora-* flags (None without --lora-rank)."""
    if not getattr(args, "lora_rank", None):
        return None
    return LoRA(
        target_modules=list(args.lora_target_modules), dim=args.lora_rank,
        alpha=args.lora_alpha, dropout=args.lora_dropout, seed=args.seed,
    )  # fmt: skip


def global_name(name: str, *, module_of) -> str:
    """`name` with its local layer index replaced by the global one (pipeline stages number
    their layers from 0; Megatron's layer_number is global and 1-based)."""
    m = _LAYER.search(name)
    if not m:
        return name
    layer = module_of.get_submodule(name[: m.end() - 1])
    number = getattr(layer, "layer_number", None)
    if number is None:
        return name
    return name[: m.start(1)] + str(number - 1) + name[m.end(1) :]


class ParallelLinearAdapter(torch.nn.Module):
    """A, B of one layer, sharded as the layer (module docstring); forward gives the update."""

    def __init__(self, base, name: str, lora: LoRA) -> None:
        super().__init__()
        self.column = isinstance(base, ColumnParallelLinear)
        self.tp_group = base.tp_group
        tp_size, tp_rank = group_size(base.tp_group), group_rank(base.tp_group)
        if getattr(base, "is_expert", False) and tp_size > 1:
            raise ValueError(f"LoRA on {name}: expert layers are adapted at expert-TP 1 only")
        if self.column and base.gather_output:
            raise ValueError(f"LoRA on {name}: a column-parallel layer with gather_output")
        if not self.column and not base.input_is_parallel:
            raise ValueError(f"LoRA on {name}: a row-parallel layer whose input is not parallel")
        self.sequence_parallel = bool(getattr(base, "sequence_parallel", False)) and tp_size > 1
        self.tp_size = tp_size
        self.scale = lora.alpha / lora.dim
        self.dropout = torch.nn.Dropout(lora.dropout) if lora.dropout > 0 else None
        # a GLU fc1 holds [gate; up] rows, each split over TP: rank r has [gate_r; up_r]
        self.glu = self.column and name.endswith("linear_fc1") and base.config.gated_linear_unit
        self.tp_rank = tp_rank
        a, b = _initial(base.input_size, base.output_size, name, lora)  # [r, in], [out, r]
        a, b = self.shard("linear_in", a), self.shard("linear_out", b)
        dtype = base.weight.dtype
        self.linear_in = torch.nn.Linear(a.shape[1], a.shape[0], bias=False, dtype=dtype)
        self.linear_out = torch.nn.Linear(b.shape[1], b.shape[0], bias=False, dtype=dtype)
        with torch.no_grad():
            self.linear_in.weight.copy_(a)
            self.linear_out.weight.copy_(b)
        self.linear_in.to(base.weight.device)
        self.linear_out.to(base.weight.device)
        sharded, whole = (
            (self.linear_out.weight, self.linear_in.weight)
            if self.column
            else (self.linear_in.weight, self.linear_out.weight)
        )
        set_tensor_model_parallel_attributes(sharded, True, 0 if self.column else 1, 1)
        set_tensor_model_parallel_attributes(whole, False, 0, 1)
        if self.sequence_parallel:
            whole.sequence_parallel = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: the base layer's input -> the update to add to its output (same shape)."""
        if self.dropout is not None:
            if self.column and not self.sequence_parallel:
                x = self.dropout(x)  # the input is the same on every TP rank: so is the mask
            else:  # a TP-split input: masks drawn per rank, as Megatron's for such activations
                with get_cuda_rng_tracker().fork():
                    x = self.dropout(x)
        h = F.linear(x, self.linear_in.weight)  # [s(/tp), b, r] (partial for a row layer)
        if self.column:
            if self.sequence_parallel:
                h = gather_from_sequence_parallel_region(h, group=self.tp_group)  # [s, b, r]
            elif self.tp_size > 1:
                h = copy_to_tensor_model_parallel_region(h, group=self.tp_group)
        elif self.sequence_parallel:
            h = reduce_scatter_to_sequence_parallel_region(h, group=self.tp_group)
        elif self.tp_size > 1:
            h = reduce_from_tensor_model_parallel_region(h, group=self.tp_group)
        return F.linear(h, self.linear_out.weight) * self.scale  # [s(/tp), b, o(/tp)]

    def _split(self, part: str) -> int | None:
        """The dim along which `part`'s whole weight is split over TP (None: not split)."""
        if self.tp_size == 1:
            return None
        if self.column:
            return 0 if part == "linear_out" else None
        return 1 if part == "linear_in" else None

    def shard(self, part: str, whole: torch.Tensor) -> torch.Tensor:
        """This rank's piece of `part`'s whole weight (or of a tensor of its shape)."""
        dim = self._split(part)
        if dim is None:
            return whole
        if self.glu:
            return torch.cat([h.chunk(self.tp_size)[self.tp_rank] for h in whole.chunk(2)])
        return whole.chunk(self.tp_size, dim=dim)[self.tp_rank]

    def gather(self, part: str, local: torch.Tensor) -> torch.Tensor:
        """Inverse of `shard` over the TP group (collective when `part` is split)."""
        dim = self._split(part)
        if dim is None:
            return local.detach().clone()
        pieces = [torch.empty_like(local) for _ in range(self.tp_size)]
        torch.distributed.all_gather(pieces, local.detach().contiguous(), group=self.tp_group)
        if self.glu:
            halves = [p.chunk(2) for p in pieces]
            return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
        return torch.cat(pieces, dim=dim)

    def delta_weight(self) -> torch.Tensor:
        """This rank's shard of (alpha / dim) * B A, the base weight's shape."""
        return self.scale * (self.linear_out.weight @ self.linear_in.weight)


def _initial(in_size: int, out_size: int, name: str, lora: LoRA):
    """Whole A [r, in] and B [out, r], the same on every rank and layout."""
    g = torch.Generator().manual_seed(lora.seed * 1_000_003 + zlib.crc32(name.encode()))
    r = lora.dim
    if lora.lora_A_init_method == "xavier":
        bound = math.sqrt(6.0 / (in_size + r))
    else:  # kaiming_uniform_ with a = sqrt(5): bound = 1 / sqrt(fan_in)
        bound = 1.0 / math.sqrt(in_size)
    a = (torch.rand(r, in_size, generator=g) * 2 - 1) * bound
    b = torch.zeros(out_size, r)
    if lora.lora_B_init_method == "normal":
        b = torch.randn(out_size, r, generator=g) * 0.02
    return a, b


def _add_update(module, args, output):
    """Forward hook: the layer's (output, bias) with the adapter's update added."""
    out, bias = output
    return out + module.adapter(args[0]).to(out.dtype), bias


def _drop_adapter_keys(module, state_dict, prefix, local_metadata):
    """state_dict hook: the model's keys stay the base model's (adapters: adapter_io)."""
    for key in [k for k in state_dict if k.startswith(prefix + "adapter.")]:
        del state_dict[key]


def _allow_missing_adapter_keys(module, incompatible_keys):
    """load_state_dict post hook: a base state dict (without adapters) loads strictly."""
    keys = incompatible_keys.missing_keys
    keys[:] = [k for k in keys if ".adapter.linear_" not in k]


def _attach(module, name: str, lora: LoRA) -> None:
    if not isinstance(module, ColumnParallelLinear | RowParallelLinear):
        raise ValueError(
            f"LoRA target {name} is a {type(module).__name__}; gigatron adapts "
            "ColumnParallelLinear and RowParallelLinear layers"
        )
    module.adapter = ParallelLinearAdapter(module, name, lora)
    module._lora_hook = module.register_forward_hook(_add_update)
    module._register_state_dict_hook(_drop_adapter_keys)
    module.register_load_state_dict_post_hook(_allow_missing_adapter_keys)


def adapted_layers(model):
    """(global name, layer) of every adapted layer of `model` (a module or a list of chunks)."""
    for chunk in unwrap_model(model if isinstance(model, list) else [model]):
        for name, module in chunk.named_modules():
            if hasattr(module, "adapter") and hasattr(module, "_lora_hook"):
                yield global_name(name, module_of=chunk), module


class LoRAMerge:
    """Fold every adapter into its base weight (W += alpha / dim * B A, per rank's shard) and
    remove it: the model then computes what the adapted model computed, with no adapter."""

    @torch.no_grad()
    def __call__(self, model):
        for _, module in list(adapted_layers(model)):
            module.weight.add_(module.adapter.delta_weight().to(module.weight.dtype))
            module._lora_hook.remove()
            del module._lora_hook
            del module.adapter
        return model
