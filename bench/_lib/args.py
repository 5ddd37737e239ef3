"""Command line of bench/gpt/bench_gpt.py: the named model shapes and the switches."""

from __future__ import annotations

import argparse

# name -> shape. gpt-*: the anchors' configs (bench/anchors/gpt_flops.py). llama-1b: Llama-3.2-1B's
# shape (16 layers, h 2048, 32 query / 8 KV heads, SwiGLU ffn 8192, RoPE, RMSNorm, no biases,
# tied embeddings) with the anchors' vocab 50304, seq 2048, micro-batch 4.
CONFIGS = {
    "gpt-125m": dict(layers=12, hidden=768, heads=12, seq=1024, mbs=16, vocab=50304),
    "gpt-1.3b": dict(layers=24, hidden=2048, heads=16, seq=2048, mbs=4, vocab=50304),
    "llama-1b": dict(
        layers=16,
        hidden=2048,
        heads=32,
        kv_heads=8,
        ffn=8192,
        seq=2048,
        mbs=4,
        vocab=50304,
        swiglu=True,
        rope=True,
        rmsnorm=True,
        bias=False,
    ),
    # Llama-3-8B's layer (hidden 4096, ffn 14336, 32 / 8 heads, seq 8192) cut to 8 of its 32 layers
    "llama3-8b-8l": dict(
        layers=8,
        hidden=4096,
        heads=32,
        kv_heads=8,
        ffn=14336,
        seq=8192,
        mbs=1,
        vocab=128256,
        swiglu=True,
        rope=True,
        rmsnorm=True,
        bias=False,
    ),
    # MoE (issue 34): Mixtral's shape cut to 8 layers (the MoE anchors' model: 16 query / 8 KV
    # heads, 8 SwiGLU experts of ffn 4096, top-2), and a fine-grained DeepSeek-style one (64
    # experts of ffn 1024, top-8, 2 shared experts = one shared MLP of ffn 2048, 16 heads)
    "mixtral-8l": dict(
        layers=8,
        hidden=2048,
        heads=16,
        kv_heads=8,
        ffn=4096,
        seq=2048,
        mbs=4,
        vocab=50304,
        swiglu=True,
        rope=True,
        rmsnorm=True,
        bias=False,
        experts=8,
        topk=2,
        moe_ffn=4096,
    ),
    "deepseek-fg": dict(
        layers=8,
        hidden=2048,
        heads=16,
        ffn=4096,
        seq=2048,
        mbs=4,
        vocab=50304,
        swiglu=True,
        rope=True,
        rmsnorm=True,
        bias=False,
        experts=64,
        topk=8,
        moe_ffn=1024,
        shared_ffn=2048,
    ),
    "tiny-moe": dict(
        layers=2,
        hidden=64,
        heads=4,
        kv_heads=2,
        ffn=128,
        seq=32,
        mbs=2,
        vocab=512,
        swiglu=True,
        rope=True,
        rmsnorm=True,
        bias=False,
        experts=4,
        topk=2,
        moe_ffn=32,
        shared_ffn=64,
    ),
    "tiny": dict(layers=2, hidden=64, heads=4, seq=32, mbs=2, vocab=512),
    "tiny-llama": dict(
        layers=2,
        hidden=64,
        heads=4,
        kv_heads=2,
        ffn=128,
        seq=32,
        mbs=2,
        vocab=512,
        swiglu=True,
        rope=True,
        rmsnorm=True,
        bias=False,
    ),
}


def _layout_path(a) -> bool:
    """PP, CP or several micro-batches: the step runs through the pipeline schedule."""
    return a.pp > 1 or a.cp > 1 or a.num_microbatches > 1


def parse_args(argv=None, doc: str | None = None):
    """bench_gpt.py's switches, defaults resolved per --impl and --device; checked."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", default="gpt-125m", choices=sorted(CONFIGS))
    p.add_argument("--impl", default="fast", choices=["fast", "plain"])
    p.add_argument("--spec", choices=["local", "fast"], help="default: per --impl")
    p.add_argument(
        "--compile", choices=["none", "layers", "model"], help="default: per --impl (layers)"
    )
    p.add_argument(
        "--fullgraph",
        choices=["auto", "on", "off"],
        default="auto",
        help="layer compile without graph breaks; auto: on (TP/SP collectives are traced), off "
        "for --cp with p2p (ring attention's send/recv break the graph)",
    )
    p.add_argument("--inductor-tuning", action="store_true", help="coordinate-descent tuning")
    p.add_argument(
        "--no-memory-reorder",
        action="store_true",
        help="Inductor reorder_for_peak_memory off: TP backward keeps the weight-grad GEMM "
        "between the reduce-scatter and its wait "
        "(tests/core/tensor_parallel/test_compile_wait_placement.py)",
    )
    p.add_argument(
        "--comm-reorder",
        action="store_true",
        help="Inductor reorder_for_compute_comm_overlap (collectives raised, waits sunk)",
    )
    p.add_argument(
        "--layers-per-graph",
        type=_layers_per_graph,
        default=1,
        help="one compiled graph per this many consecutive layers, or a comma list of group "
        "sizes (4,20) (--compile layers; with --compile model the model's graphs stop around "
        "them: DDP buckets start per group)",
    )
    p.add_argument(
        "--compile-mode", default=None, help="torch.compile mode (reduce-overhead: CUDA graphs)"
    )
    p.add_argument(
        "--no-input-checks",
        action="store_true",
        help="skip the embedding's token/position id range check (its one host sync per step)",
    )
    p.add_argument(
        "--gelu",
        choices=["erf", "tanh"],
        default="erf",
        help="GELU of the GPT configs: erf (F.gelu, Megatron's default) or tanh (Megatron's "
        "--openai-gelu; the plain-PyTorch anchor's model uses it)",
    )
    p.add_argument(
        "--row-bias-in-gemm",
        action="store_true",
        help="experiment: attention proj / MLP fc2 add their bias in the GEMM (TP = 1) instead "
        "of the residual-add kernel (skip_bias_add=False; changes what SelfAttention/MLP return)",
    )
    p.add_argument(
        "--anchor-init",
        action="store_true",
        help="experiment: the anchor's initial values (PyTorch defaults: U(+-1/sqrt(fan_in)) "
        "linears and biases, N(0, 1) embeddings) instead of Megatron's; TP = 1",
    )
    p.add_argument(
        "--ce",
        choices=["plain", "chunked", "chunked-recompute", "chunked-grad-in-forward"],
        help="plain: logits then cross entropy; chunked: GPTModel's cross_entropy_loss_fusion "
        "(logits recomputed in backward); chunked-recompute: the same (the name of earlier "
        "reports); chunked-grad-in-forward: cross_entropy_fusion_impl='native_grad_in_forward' "
        "(gradients in forward, no logits recompute). Default: per --impl",
    )
    p.add_argument("--sdpa", default=None, help="comma list, e.g. cudnn,flash ('default': torch)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--sp", action="store_true", help="sequence parallelism (TP > 1)")
    p.add_argument(
        "--tp-comm-overlap",
        action="store_true",
        help="TransformerConfig.tp_comm_overlap: SP all-gather overlapped with the own rows' GEMM",
    )
    p.add_argument(
        "--tp-comm-ce",
        action="store_true",
        help="TP all-gathers / reduce-scatters on the copy engines (symmetric memory, no SMs)",
    )
    p.add_argument(
        "--async-tp",
        action="store_true",
        help="Inductor async TP (micro-pipeline TP over symmetric memory) in the compiled layers",
    )
    p.add_argument(
        "--sm-carveout", type=int, default=None, help="cuBLAS leaves this many SMs free (NCCL)"
    )
    p.add_argument(
        "--ep",
        type=int,
        default=1,
        help="expert parallelism (MoE configs; > 1: the all-to-all reads split sizes on the host)",
    )
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (1F1B schedule)")
    p.add_argument("--vpp", type=int, default=None, help="model chunks per stage (interleaved)")
    p.add_argument("--cp", type=int, default=1, help="context parallelism (sequence split)")
    p.add_argument("--cp-comm-type", default="p2p", choices=["p2p", "all_gather", "a2a"])
    p.add_argument(
        "--num-microbatches", type=int, default=None, help="per step; default 2*pp (pp > 1), else 1"
    )
    p.add_argument("--num-layers", type=int, default=None, help="override the config's layers")
    p.add_argument(
        "--init",
        choices=["auto", "invariant", "device"],
        default="auto",
        help="invariant: layout-invariant CPU init (same model in any layout); auto: on CPU",
    )
    p.add_argument("--ddp", choices=["auto", "on", "off"], default="auto", help="auto: DP > 1")
    p.add_argument("--overlap-grad-reduce", action="store_true")
    p.add_argument(
        "--grad-acc-fusion",
        action="store_true",
        help="gradient_accumulation_fusion: the linears add dW into DDP's main_grad (addmm_)",
    )
    p.add_argument(
        "--bucket-size", type=int, default=None, help="DDP bucket elements (default Megatron's)"
    )
    p.add_argument(
        "--optimizer",
        default="torch-fused",
        choices=[
            "torch-fused",
            "torch-foreach",
            "compiled",
            "flat",
            "flat-overlap",
            "multi-tensor",
            "none",
        ],
        help="compiled: torch.compile of a foreach AdamW step (Inductor-fused kernels); flat: "
        "gigatron's FlatAdamW over DDP's flat grad buffers (needs DDP: --ddp on at DP = 1); "
        "flat-overlap: FlatAdamW.finish_grad_sync_and_step (the last buckets' collective beside "
        "the other buckets' update); "
        "multi-tensor: gigatron's MultiTensorAdamW (one Triton launch over all tensors); "
        "none: forward + backward only (what the MoE anchors time)",
    )
    p.add_argument(
        "--experts",
        choices=["grouped", "sequential"],
        default="grouped",
        help="MoE configs: GroupedMLP (torch._grouped_mm, sync-free) or SequentialMLP",
    )
    p.add_argument(
        "--moe-shared-expert-overlap",
        action="store_true",
        help="MoE configs with shared experts, EP > 1: the shared experts run while the "
        "dispatcher's all-to-alls are in flight (moe_shared_expert_overlap)",
    )
    p.add_argument(
        "--aux-loss-coeff",
        type=float,
        default=1e-2,
        help="MoE configs: moe_aux_loss_coeff (the megatron-core anchor's 1e-2)",
    )
    p.add_argument(
        "--sync-debug", action="store_true", help="report the host syncs of one step (source lines)"
    )
    p.add_argument(
        "--fp8", default=None, choices=["tensorwise", "rowwise", "rowwise_with_gw_hp"],
        help="FP8 GEMMs in the transformer layers with this recipe (TransformerConfig.fp8_recipe)",
    )  # fmt: skip
    p.add_argument("--fp8-format", default="hybrid", choices=["e4m3", "hybrid"], help="with --fp8")
    p.add_argument("--micro-batch-size", type=int, default=None)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--profile", default=None, help="write top kernels of 2 profiled steps here")
    p.add_argument(
        "--trace", default=None, help="with --profile: write one step's kernel timeline (.json.gz)"
    )
    p.add_argument("--label", default=None)
    a = p.parse_args(argv)
    fast = a.impl == "fast"
    a.spec = a.spec or ("fast" if fast else "local")
    a.compile = a.compile or ("layers" if fast and a.device == "cuda" else "none")
    a.ce = a.ce or ("chunked" if fast else "plain")
    if a.sdpa is None:
        a.sdpa = "cudnn,flash,efficient" if fast and a.device == "cuda" else "default"
    if a.num_microbatches is None:
        a.num_microbatches = 2 * a.pp if a.pp > 1 else 1
    if a.init == "auto":
        a.init = "invariant" if a.device == "cpu" else "device"
    _check_layout_args(a)
    return a


def _check_layout_args(a) -> None:
    """Flag combinations the pipeline / CP step does not run (bench_gpt.py)."""
    for name in ("tp", "ep", "pp", "cp", "num_microbatches", "steps"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} ({getattr(a, name)}) must be >= 1")
    if a.async_tp and not (a.tp > 1 and a.sp and a.compile != "none" and a.device == "cuda"):
        raise ValueError(
            "--async-tp needs --tp > 1, --sp, a compiled model and --device cuda (bench_gpt.py)"
        )
    if a.vpp is not None and (a.pp < 2 or a.vpp < 2):
        raise ValueError(f"--vpp ({a.vpp}) needs --pp >= 2 and --vpp >= 2 (bench_gpt.py)")
    if a.layers_per_graph != 1 and a.compile == "none":
        raise ValueError(
            f"--layers-per-graph {a.layers_per_graph} needs --compile layers or model "
            "(bench_gpt.py)"
        )
    if _layout_path(a) and a.compile == "model":
        raise ValueError(
            "--compile model works only with pp = cp = num_microbatches = 1 (bench_gpt.py)"
        )
    if a.anchor_init and (a.tp != 1 or a.pp != 1):
        raise ValueError(
            f"--anchor-init needs --tp 1 and --pp 1 (got {a.tp}, {a.pp}): it draws whole, "
            "untied-by-stage weights (bench_gpt.py)"
        )
    if a.optimizer == "none" and _layout_path(a):
        raise ValueError("--optimizer none works only with pp = cp = num_microbatches = 1")
    if a.optimizer.startswith("flat") and (_layout_path(a) or a.ddp == "off"):
        raise ValueError(
            "--optimizer flat needs DDP (--ddp on or auto with DP > 1) and pp = cp = "
            "num_microbatches = 1 (bench_gpt.py)"
        )
    if _layout_path(a) and a.ddp == "off":
        raise ValueError("--ddp off works only with pp = cp = num_microbatches = 1 (bench_gpt.py)")


def _layers_per_graph(text: str):
    from gigatron.core.transformer.fast_path import parse_layers_per_graph

    return parse_layers_per_graph(text)
