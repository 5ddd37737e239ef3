"""The fast-path adapter: torch.compile of transformer layers and the SDPA kernel choice.

gigatron-specific (Megatron gets the same effect from Transformer Engine's fused kernels and
`torch.jit`-scripted fusions). Everything here runs at run time on stock PyTorch (Inductor /
Triton); nothing needs a compiled extension at install time. The plain (eager) path is the
reference: `tests/core/transformer/test_fast_path_cuda.py` checks each piece against it.

- `compile_transformer_layers(model)`: `torch.compile` each TransformerLayer in place (its
  forward and, through AOTAutograd, its backward): norms, bias + GELU/SwiGLU, RoPE, bias +
  dropout + residual become a few fused Triton kernels around the cuBLAS matmuls and the SDPA
  kernel. Every layer shares one compiled graph (same code, parameters passed as inputs).
  `layers_per_graph=N` compiles runs of N consecutive layers as one graph instead: fewer
  launches and fusion across layer boundaries (a layer's last residual add with the next
  layer's norm), while a DDP bucket can still start after each group's backward.
- `sdpa_backends(names)`: a context manager choosing (and ordering) SDPA backends, e.g.
  `("cudnn", "flash")`: cuDNN's fused attention is Hopper-tuned and faster than FlashAttention-2
  on H100/H200; it must be active when a compiled graph is traced, so wrap the training step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

from gigatron.core.transformer.transformer_block import TransformerBlock
from gigatron.core.transformer.transformer_layer import TransformerLayer

_FILE = "gigatron/core/transformer/fast_path.py"

_BACKENDS = ("cudnn", "flash", "efficient", "math")


def _raise_recompile_limit(limit: int) -> None:
    # Layers differ only in parameters, but a per-layer constant (layer_number) can add guards;
    # a higher limit keeps a few variants compiled instead of silently falling back to eager.
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name) and getattr(cfg, name) < limit:
            setattr(cfg, name, limit)


def compile_transformer_layers(
    model: torch.nn.Module,
    *,
    fullgraph: bool = True,
    mode: str | None = None,
    dynamic: bool = False,
    options: dict | None = None,
    layers_per_graph: int | Sequence[int] = 1,
    backend="inductor",
) -> int:
    """Compile every TransformerLayer inside `model` in place; returns how many were compiled.

    `backend` is torch.compile's (tests use "aot_eager" or a recording backend).
    `layers_per_graph` > 1: each TransformerBlock runs its layers in groups of that many
    consecutive layers (the last group may be shorter), each group one compiled function; the
    layers themselves stay uncompiled modules (state_dict, hooks and names unchanged). A list
    gives the group sizes in layer order (they must add up to each block's layer count): a
    short first group leaves less DDP communication after the last backward graph, e.g.
    `[4, 20]` for 24 layers.

    `fullgraph=True` makes a graph break an error instead of a silent slow path (TP/SP
    collectives are traced as functional collectives, so this holds under TP too); False
    compiles each piece between breaks. It is dropped (False) for TP > 1 without sequence
    parallel and attention dropout > 0 (the model-parallel RNG fork breaks the graph there) and
    for MoE layers that are not `MoELayer.sync_free` (they read token counts on the host). A
    sync-free MoE layer (one rank holds every expert, dropless, GroupedMLP) is one graph: router,
    top-k, aux losses, permutation, grouped GEMMs and unpermutation.
    `mode` is torch.compile's (None, "max-autotune-no-cudagraphs", ...); `options` are Inductor
    options (e.g. {"coordinate_descent_tuning": True}); give one or the other. With neither, a
    model using `tp_comm_overlap` under SP compiles with `reorder_for_peak_memory=False` so the
    backward keeps its collectives under the weight-gradient GEMMs.
    """

    sizes = _group_sizes(layers_per_graph)
    layers = [m for m in model.modules() if isinstance(m, TransformerLayer)]
    if not layers:
        raise ValueError(
            f"compile_transformer_layers: no TransformerLayer in {type(model)} ({_FILE})"
        )
    _raise_recompile_limit(max(64, 2 * len(layers)))
    if options is None and mode is None and _wants_comm_overlap(layers):
        # Inductor's peak-memory reordering would move the weight-gradient GEMM after the wait
        # of the input-gradient reduce-scatter it is meant to hide (see
        # tests/core/tensor_parallel/test_compile_wait_placement.py); keep the order the linears
        # issue.
        options = {"reorder_for_peak_memory": False}
    if fullgraph and _needs_tp_dropout_fork(layers):
        # TP > 1 without SP: attention dropout forks the model-parallel RNG (different masks per
        # TP rank), a state swap dynamo cannot trace: the layer graphs break around it
        fullgraph = False
    if fullgraph and any(getattr(layer.mlp, "sync_free", True) is False for layer in layers):
        # an MoE layer that reads token counts on the host (EP / expert TP > 1: the all-to-all
        # split sizes; capacity dropping; SequentialMLP): its graphs break there
        fullgraph = False
    kw = dict(fullgraph=fullgraph, mode=mode, dynamic=dynamic, options=options, backend=backend)
    if sizes != [1]:
        # a DDP model with overlap_param_gather hooks its units; groups become units of their own
        rehook = bool(getattr(model, "remove_forward_pre_hook_handles", None))
        if rehook:
            model.disable_forward_pre_hook(param_sync=False)
        count = _compile_layer_groups(model, sizes, kw)
        if rehook:
            model.enable_forward_pre_hook()
        return count
    for layer in layers:
        layer.compile(**kw)
    return len(layers)


def _needs_tp_dropout_fork(layers) -> bool:
    """Whether a layer's attention dropout runs under the TP RNG tracker's fork when compiled
    (DotProductAttention._dropout_rng): TP > 1, no sequence parallel, attention dropout > 0."""
    config = layers[0].config
    return (
        config.tensor_model_parallel_size > 1
        and not config.sequence_parallel
        and config.attention_dropout > 0
    )


def parse_layers_per_graph(text: str) -> int | list[int]:
    """A command-line `layers_per_graph`: "6" -> 6, "4,20" -> [4, 20] (checked when used)."""
    try:
        sizes = [int(part) for part in str(text).split(",")]
    except ValueError:
        raise ValueError(
            f"layers per graph ({text!r}) must be an int or a comma list of ints, e.g. 6 or "
            f"4,20 ({_FILE})"
        ) from None
    return sizes[0] if len(sizes) == 1 else sizes


def _group_sizes(layers_per_graph) -> list[int]:
    """[N] for an int N >= 1, the list itself for a non-empty list of ints >= 1."""
    sizes = [layers_per_graph] if isinstance(layers_per_graph, int) else layers_per_graph
    if (
        isinstance(layers_per_graph, (bool, str))
        or not isinstance(sizes, (list, tuple))
        or not sizes
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes)
    ):
        raise ValueError(
            f"compile_transformer_layers: layers_per_graph ({layers_per_graph!r}) must be an "
            f"int >= 1 or a non-empty list of ints >= 1 ({_FILE})"
        )
    return list(sizes)


def _compile_layer_groups(model: torch.nn.Module, sizes: list[int], compile_kw: dict) -> int:
    """Give every TransformerBlock in `model` one compiled function per group of layers:
    groups of `sizes[0]` layers (one size), or of the listed sizes in order."""

    count = 0
    for block in (m for m in model.modules() if isinstance(m, TransformerBlock)):
        n = len(block.layers)
        if block.config.recompute_granularity == "full":
            raise ValueError(
                f"compile_transformer_layers: layers_per_graph {sizes} with "
                "recompute_granularity='full': the checkpointed chunks run the layers one by "
                f"one, outside the groups; compile single layers instead ({_FILE})"
            )
        if len(sizes) == 1:
            bounds = [(start, min(n, start + sizes[0])) for start in range(0, n, sizes[0])]
        elif sum(sizes) != n:
            raise ValueError(
                f"compile_transformer_layers: layers_per_graph {sizes} adds up to {sum(sizes)}, "
                f"but the block has {n} layers; the sizes must add up to it ({_FILE})"
            )
        else:
            ends = [sum(sizes[: i + 1]) for i in range(len(sizes))]
            bounds = list(zip([0, *ends[:-1]], ends))
        groups = [
            torch.compile(_layer_group(block, start, end), **compile_kw) for start, end in bounds
        ]
        block._compiled_layer_groups = groups
        block._compiled_layer_group_bounds = bounds
        block._run_compiled_layer_groups = torch._dynamo.disable(
            _run_groups(block, groups), recursive=False
        )
        count += n
    return count


def _run_groups(block, groups):
    """`(hidden_states, context, kw) -> (hidden_states, context)` through the compiled groups in
    turn. Wrapped in `torch._dynamo.disable(recursive=False)`: never traced itself (the groups
    still run their own compiled graphs), so a whole model compiled around it breaks there: its
    graphs end before the first group and resume after the last, and each group's backward stays
    a separate graph (DDP buckets can start between them). Before each group, its pre-hook if
    DDP set one in `block._layer_group_pre_hooks` (`overlap_param_gather`: wait for the group's
    param all-gathers here, outside the graph)."""

    def run(hidden_states, context, kw):
        pre_hooks = getattr(block, "_layer_group_pre_hooks", None) or {}
        for index, group in enumerate(groups):
            if index in pre_hooks:
                pre_hooks[index](block)
            hidden_states, context = group(hidden_states, context, **kw)
        return hidden_states, context

    return run


def _layer_group(block, start: int, end: int):
    """`(hidden_states [s, b, h], context) -> (hidden_states, context)` through
    `block.layers[start:end]`, the loop of `TransformerBlock._run_layers`."""

    def run(hidden_states, context, **kw):
        for index in range(start, end):
            hidden_states, context = block.layers[index](hidden_states, context=context, **kw)
        return hidden_states, context

    return run


def _wants_comm_overlap(layers) -> bool:
    """Some layer runs sequence parallelism with `tp_comm_overlap` on."""
    return any(
        getattr(layer.config, "tp_comm_overlap", False)
        and getattr(layer.config, "sequence_parallel", False)
        and getattr(layer.config, "tensor_model_parallel_size", 1) > 1
        for layer in layers
    )


def enable_async_tensor_parallel(group) -> None:
    """Inductor's micro-pipeline TP ("async TP") in every graph compiled from now on.

    Each traced sequence-parallel `all-gather -> matmul` and `matmul -> reduce-scatter` of the
    TP linears (`_c10d_functional` ops, see tensor_parallel/_collectives.py) becomes one
    symmetric-memory op that moves the peers' rows over NVLink while the matmul of the rows
    already here runs. Same numbers, up to the order of the partial matmuls. CUDA + NCCL only;
    call it on every rank of `group` before the first compiled step. Experimental: on two H200
    without NVLink multicast it halved TP=2 throughput (bench/reports/gpt-tensor-parallel.md), so
    nothing turns it on by default; `tests/core/transformer/test_compile_async_tp_patterns.py`
    checks the patterns.
    """
    import torch.distributed as dist

    if not (torch.cuda.is_available() and dist.is_available() and dist.is_nccl_available()):
        raise ValueError(f"async tensor parallelism needs CUDA and NCCL ({_FILE})")
    from torch._inductor import config
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    config._micro_pipeline_tp = True
    enable_symm_mem_for_group(group.group_name)


def sdpa_backends(names: tuple[str, ...] | list[str] | None):
    """Context manager restricting SDPA to `names` (in priority order); None = PyTorch default."""
    if not names:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    table = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }
    bad = [n for n in names if n not in table]
    if bad:
        raise ValueError(f"sdpa backend names {bad} must be among {_BACKENDS} ({_FILE})")
    return sdpa_kernel([table[n] for n in names], set_priority=True)
