"""Throughput of one gigatron GPT training step (forward, backward, optimizer) as JSON.

    python bench/gpt/bench_gpt.py --config gpt-125m                       # fast path, one GPU
    python bench/gpt/bench_gpt.py --config gpt-1.3b --impl plain          # local spec, eager
    torchrun --nproc-per-node 2 bench/gpt/bench_gpt.py --config gpt-1.3b --tp 2 --sp
    torchrun --nproc-per-node 2 bench/gpt/bench_gpt.py --config gpt-125m --overlap-grad-reduce
    torchrun --nproc-per-node 2 bench/gpt/bench_gpt.py --config gpt-1.3b --pp 2 --num-microbatches 8
    torchrun --nproc-per-node 2 bench/gpt/bench_gpt.py --config llama-1b --cp 2 --cp-comm-type a2a
    python bench/gpt/bench_gpt.py --config tiny --device cpu               # harness check on CPU

Timed like the anchors in bench/anchors (copies of shared/bench/anchors): random tokens, bf16
params, fused AdamW on the bf16 params, 5 warm-up steps, mean of 10 timed steps, FLOPs by the
Megatron formula (gigatron/training/flops.py, equal to the anchors' formula for a plain GPT),
MFU against 989 TFLOP/s. The last line on rank 0 is `RESULT {json}`; its `gpu_power` holds rank
0's SM clock and board power during the timed steps (nvidia-smi polled, bench/_lib/power.py;
None on CPU): at the GPU's power limit the clock, and so the GEMMs, depend on the data.

`--impl fast` = SDPA spec + compiled layers + chunked cross entropy + cuDNN-first SDPA;
`--impl plain` = local spec, eager, plain cross entropy. Each switch can be overridden.
PP / VPP / CP / several micro-batches run the Megatron train step through the pipeline schedule
(bench/gpt/_layouts.py); tokens/s counts micro_batch * seq * num_microbatches * dp.
`--init invariant` (the CPU default) gives every layout the one-rank model: equal `first_loss`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

# the repo root: gigatron and bench.* import without an install
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench._lib.args import CONFIGS, _layout_path, parse_args  # noqa: E402
from bench._lib.power import GpuSampler  # noqa: E402
from bench._lib.profiling import host_syncs, profile_step  # noqa: E402
from gigatron.training._config_from_args import openai_gelu  # noqa: E402
from gigatron.training.flops import flops_per_token  # noqa: E402

PEAK = 989e12  # H200/H100 dense bf16 datasheet peak (the anchors' MFU denominator)


def build_model(shape: dict, a, pre_process=True, post_process=True, vp_stage=None, config=None):
    """gigatron GPTModel in bf16 (fp32 on CPU) with tied embeddings, no dropout; this stage's
    chunk (`pre_process` / `post_process` / `vp_stage`) under PP. `config`: reuse this
    TransformerConfig (the other chunks of a VPP rank). Returns (model, config)."""
    from gigatron.core.models.gpt import GPTModel
    from gigatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_fast_spec,
        get_gpt_layer_local_spec,
    )
    from gigatron.core.transformer.transformer_config import TransformerConfig

    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    swiglu = shape.get("swiglu", False)
    layout = {}  # only non-default fields, so the DP / TP config is the one of earlier reports
    if a.pp > 1:
        layout.update(pipeline_model_parallel_size=a.pp, virtual_pipeline_model_parallel_size=a.vpp)
    if a.cp > 1:
        layout.update(context_parallel_size=a.cp, cp_comm_type=a.cp_comm_type)
    if a.ep > 1:
        layout["expert_model_parallel_size"] = a.ep
    if a.init == "invariant":
        layout["use_cpu_initialization"] = True
    if a.tp_comm_overlap:
        layout["tp_comm_overlap"] = True
    if a.grad_acc_fusion:
        layout["gradient_accumulation_fusion"] = True
    if a.ce != "plain":
        layout["cross_entropy_loss_fusion"] = True  # GPTModel's chunked CE
    if a.ce == "chunked-grad-in-forward":  # the mean loss's gradient is uniform: no mask needed
        layout["cross_entropy_fusion_impl"] = "native_grad_in_forward"
    if a.fp8:
        layout.update(fp8=a.fp8_format, fp8_recipe=a.fp8)
    cfg = config or TransformerConfig(
        num_layers=shape["layers"],
        hidden_size=shape["hidden"],
        num_attention_heads=shape["heads"],
        num_query_groups=shape.get("kv_heads"),
        ffn_hidden_size=shape.get("ffn"),
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        tensor_model_parallel_size=a.tp,
        sequence_parallel=a.sp,
        normalization="RMSNorm" if shape.get("rmsnorm") else "LayerNorm",
        gated_linear_unit=swiglu,
        activation_func=F.silu if swiglu else (openai_gelu if a.gelu == "tanh" else F.gelu),
        add_bias_linear=shape.get("bias", True),
        **_moe_fields(shape, a),
        **layout,
    )
    spec_fn = get_gpt_layer_fast_spec if a.spec == "fast" else get_gpt_layer_local_spec
    moe = {}
    if shape.get("experts"):
        moe = dict(num_experts=shape["experts"], moe_grouped_gemm=a.experts == "grouped")
    spec = spec_fn(**moe)
    stage = {} if vp_stage is None else {"vp_stage": vp_stage}
    with torch.device(a.device):
        model = GPTModel(
            config=cfg,
            transformer_layer_spec=spec,
            vocab_size=shape["vocab"],
            max_sequence_length=shape["seq"],
            pre_process=pre_process,
            post_process=post_process,
            share_embeddings_and_output_weights=True,
            position_embedding_type="rope" if shape.get("rope") else "learned_absolute",
            **stage,
        )
    if a.row_bias_in_gemm:
        _row_bias_in_gemm(model)
    if a.anchor_init:
        _anchor_init(model)
    return model.to(device=a.device, dtype=dtype), cfg


def _moe_fields(shape: dict, a) -> dict:
    """TransformerConfig's MoE fields of an MoE config (none for a dense one): the anchors'
    alltoall dispatcher and aux loss; GroupedMLP or SequentialMLP by `--experts`."""
    if not shape.get("experts"):
        return {}
    return dict(
        num_moe_experts=shape["experts"],
        moe_router_topk=shape["topk"],
        moe_ffn_hidden_size=shape["moe_ffn"],
        moe_shared_expert_intermediate_size=shape.get("shared_ffn"),
        moe_grouped_gemm=a.experts == "grouped",
        moe_token_dispatcher_type="alltoall",
        moe_aux_loss_coeff=a.aux_loss_coeff,
        moe_shared_expert_overlap=a.moe_shared_expert_overlap,
    )


def _anchor_init(model) -> None:
    """`--anchor-init` (experiment): the plain-PyTorch anchor's initial values instead of
    Megatron's (PyTorch module defaults: linear weights and biases U(+-1/sqrt(fan_in)), embeddings
    N(0, 1), LayerNorm 1 / 0), to compare kernel speeds on the same data distributions. TP = 1:
    fan_in is the weight's own second dimension."""
    from gigatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    with torch.no_grad():
        for module in model.modules():
            # (the tied output layer has no weight of its own)
            if isinstance(module, ColumnParallelLinear | RowParallelLinear) and (
                module.weight is not None
            ):
                bound = module.weight.shape[1] ** -0.5
                module.weight.uniform_(-bound, bound)
                if module.bias is not None:
                    module.bias.uniform_(-bound, bound)
        for name, param in model.named_parameters():
            if name.endswith("embeddings.weight"):
                param.normal_(0.0, 1.0)


def _row_bias_in_gemm(model) -> None:
    """`--row-bias-in-gemm` (experiment): the attention proj and dense MLP fc2 add their bias
    themselves (`skip_bias_add=False`: in the GEMM at TP = 1) instead of returning it to the
    bias-dropout-add, whose residual + LayerNorm kernel the bias load slows (s5 report).
    SelfAttention / MLP then return `(out + bias, None)` instead of Megatron's `(out, bias)`."""
    from gigatron.core.transformer.transformer_layer import TransformerLayer

    for layer in (m for m in model.modules() if isinstance(m, TransformerLayer)):
        for linear in (
            getattr(layer.self_attention, "linear_proj", None),
            getattr(layer.mlp, "linear_fc2", None),
        ):
            if linear is not None:
                linear.skip_bias_add = False


def _seed(a) -> None:
    """Seed 1234 for the weights. `--init invariant`: every component draws from a CPU stream
    seeded by (1234, its name), so any TP x PP x VPP x CP layout starts from the one-rank model."""
    from gigatron.core.layout_invariant_init import set_layout_invariant_init_seed
    from gigatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    torch.manual_seed(1234)
    model_parallel_cuda_manual_seed(1234)
    set_layout_invariant_init_seed(1234 if a.init == "invariant" else None)


def gpt_loss(model, tokens, pos, labels):
    """Mean LM loss through GPTModel.forward (the config's `cross_entropy_loss_fusion` picks the
    chunked output layer + cross entropy, as in training)."""
    return model(tokens, pos, None, labels=labels).mean()


def _init_dist(device: str) -> tuple[int, int]:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world)
    return rank, world


def _versions() -> dict:
    out = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        out["cuda"] = torch.version.cuda
        out["cudnn"] = torch.backends.cudnn.version()
        out["gpu"] = torch.cuda.get_device_name()
    out["gigatron_commit"] = os.environ.get("GIGATRON_COMMIT", "unknown")
    return out


class _Step:
    """One training step: zero grads, loss.backward(), (DDP grad sync), optimizer.step()."""

    def __init__(self, a, model, ddp, opt, batch, sdpa_ctx):
        self.a, self.model, self.ddp, self.opt, self.batch = a, model, ddp, opt, batch
        self.sdpa_ctx = sdpa_ctx
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.loss_fn = gpt_loss
        if a.compile == "model":  # whole forward + loss in one torch.compile (graph breaks ok)
            options = {"coordinate_descent_tuning": True} if a.inductor_tuning else None
            self.loss_fn = torch.compile(gpt_loss, mode=a.compile_mode, options=options)

    def __call__(self) -> torch.Tensor:
        if self.ddp is not None:
            self.ddp.zero_grad_buffer()
        if self.opt is None:  # --optimizer none: forward + backward only
            for p in self.params:
                p.grad = None
        else:
            self.opt.zero_grad(set_to_none=True)
        with self.sdpa_ctx():
            loss = self.loss_fn(self.model, *self.batch)
        loss.backward()
        if self.opt is None:
            return loss
        if self.a.optimizer == "flat-overlap":
            self.opt.finish_grad_sync_and_step()
            return loss
        if self.ddp is not None:
            self.ddp.finish_grad_sync()
            if self.a.optimizer != "flat":  # FlatAdamW reads DDP's grad buffers itself
                for p in self.params:  # DDP moved the grads into its buffer (param.main_grad)
                    p.grad = p.main_grad
        self.opt.step()
        return loss


def _optimizer(a, params):
    if a.optimizer == "none":
        return None
    if a.optimizer == "multi-tensor":  # gigatron's one-launch Triton AdamW
        from bench.optimizer.multi_tensor_adamw import MultiTensorAdamW

        return MultiTensorAdamW(params, lr=1e-4)
    kw = {"fused": True} if a.optimizer == "torch-fused" else {"foreach": True}
    opt = torch.optim.AdamW(params, lr=1e-4, **kw)
    if a.optimizer == "compiled":  # constant lr here (a scheduler would want lr as a tensor)
        opt.step = torch.compile(opt.step)
    return opt


def _time(step, a, device, sampler=None):
    """(seconds per timed step, warm-up seconds, loss of the first step, of the last step);
    the losses as the step returned them (the first one copied: CUDA graphs reuse outputs).
    `sampler` (a GpuSampler) runs over the timed steps only."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    first = None
    t0 = time.perf_counter()
    for _ in range(a.warmup):
        loss = step()
        first = loss.detach().clone() if first is None else first
    sync()
    warm_s = time.perf_counter() - t0
    with sampler or contextlib.nullcontext():
        t0 = time.perf_counter()
        for _ in range(a.steps):
            loss = step()
            first = loss.detach().clone() if first is None else first
        sync()
        dt = time.perf_counter() - t0
    return dt / a.steps, warm_s, first, loss


def _ddp_config(a):
    from gigatron.core.distributed import DistributedDataParallelConfig

    return DistributedDataParallelConfig(
        overlap_grad_reduce=a.overlap_grad_reduce,
        average_in_collective=True,  # NCCL AVG: no separate 1/dp pass over the grads
        bucket_size=a.bucket_size,
    )


def _compile_layers(a, chunks) -> None:
    from gigatron.core.transformer.fast_path import compile_transformer_layers

    if a.compile != "layers" and not (a.compile == "model" and a.layers_per_graph != 1):
        return  # --compile model --layers-per-graph N: the model's graphs break around groups
    # auto: on, except CP's p2p ring attention (dynamo cannot trace P2POp: eager between breaks)
    ring = a.cp > 1 and a.cp_comm_type == "p2p"
    fullgraph = a.fullgraph == "on" or (a.fullgraph == "auto" and not ring)
    options = {"coordinate_descent_tuning": True} if a.inductor_tuning else None
    for chunk in chunks:
        compile_transformer_layers(
            chunk,
            fullgraph=fullgraph,
            mode=a.compile_mode,
            options=options,
            layers_per_graph=a.layers_per_graph,
        )


def _plain_step(a, shape, dp, batch, sdpa_ctx):
    """One model, loss.backward(), DDP when DP > 1: the DP / TP ± SP step of earlier reports."""
    model, cfg = build_model(shape, a)
    use_ddp = a.ddp == "on" or (a.ddp == "auto" and dp > 1)
    ddp = None
    if use_ddp:
        from gigatron.core.distributed import DistributedDataParallel

        ddp = DistributedDataParallel(cfg, _ddp_config(a), model)
    _compile_layers(a, [model])
    if a.optimizer.startswith("flat"):
        if ddp is None:
            raise ValueError("--optimizer flat needs DDP: add --ddp on at DP = 1 (bench_gpt.py)")
        from bench.optimizer.flat_adamw import FlatAdamW

        opt = FlatAdamW(ddp, lr=1e-4)  # torch AdamW's defaults otherwise, as _optimizer's
    else:
        opt = _optimizer(a, [p for p in model.parameters() if p.requires_grad])
    return _Step(a, model, ddp, opt, batch, sdpa_ctx), use_ddp


def _layout_step(a, shape, batch, sdpa_ctx):
    """PP / VPP / CP / several micro-batches: DDP-wrapped chunk(s) through the schedule."""
    from bench.gpt._layouts import PipelineStep, build_chunks, cp_batch, wrap_ddp

    chunks, cfg = build_chunks(build_model, shape, a)
    chunks = wrap_ddp(chunks, cfg, _ddp_config(a))
    _compile_layers(a, chunks)
    opt = _optimizer(a, [p for c in chunks for p in c.parameters() if p.requires_grad])
    tokens, pos, labels = batch
    return PipelineStep(
        chunks,
        opt,
        cp_batch(tokens, labels, pos),
        sdpa_ctx,
        num_microbatches=a.num_microbatches,
        seq=shape["seq"],
        mbs=shape["mbs"],
    )


def main(argv=None) -> dict:
    a = parse_args(argv, __doc__)
    rank, world = _init_dist(a.device)
    model_parallel = a.tp * a.pp * a.cp
    if world % model_parallel != 0:
        raise ValueError(
            f"--tp x --pp x --cp ({a.tp} x {a.pp} x {a.cp}) must divide the world size ({world})"
        )
    from gigatron.core import parallel_state
    from gigatron.core.transformer.fast_path import sdpa_backends

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=a.tp,
        pipeline_model_parallel_size=a.pp,
        virtual_pipeline_model_parallel_size=a.vpp,
        context_parallel_size=a.cp,
        expert_model_parallel_size=a.ep,
    )
    dp = world // model_parallel
    if a.no_memory_reorder:
        torch._inductor.config.reorder_for_peak_memory = False
    if a.comm_reorder:
        torch._inductor.config.reorder_for_compute_comm_overlap = True
    if a.sm_carveout is not None:
        torch._C._set_sm_carveout_experimental(a.sm_carveout)
    if a.async_tp:
        from gigatron.core.transformer.fast_path import enable_async_tensor_parallel

        enable_async_tensor_parallel(parallel_state.get_tensor_model_parallel_group())
    if a.tp_comm_ce:
        from gigatron.core.tensor_parallel._collectives import enable_copy_engine_collectives

        enable_copy_engine_collectives(parallel_state.get_tensor_model_parallel_group())
    shape = dict(CONFIGS[a.config])
    if a.micro_batch_size:
        shape["mbs"] = a.micro_batch_size
    if a.num_layers:
        shape["layers"] = a.num_layers
    if a.no_input_checks:
        from gigatron.core.models.common.embeddings import language_model_embedding

        language_model_embedding.CHECK_INPUT_IDS = False
    _seed(a)
    dev = torch.device(a.device, torch.cuda.current_device() if a.device == "cuda" else None)
    g = torch.Generator(device=dev).manual_seed(1234 + parallel_state.get_data_parallel_rank())
    b, s, vocab = shape["mbs"], shape["seq"], shape["vocab"]
    tokens = torch.randint(0, vocab, (b, s), device=dev, generator=g)  # [b, s], the full sequence
    labels = torch.randint(0, vocab, (b, s), device=dev, generator=g)
    pos = torch.arange(s, device=dev).unsqueeze(0).expand(b, s)
    sdpa = None if a.sdpa == "default" else a.sdpa.split(",")
    sdpa_ctx = lambda: sdpa_backends(sdpa)  # noqa: E731
    if _layout_path(a):
        from bench.gpt._layouts import report_loss

        step, use_ddp, to_float = (
            _layout_step(a, shape, (tokens, pos, labels), sdpa_ctx),
            True,
            report_loss,
        )
    else:
        step, use_ddp = _plain_step(a, shape, dp, (tokens, pos, labels), sdpa_ctx)
        to_float = lambda loss: float(loss.detach())  # noqa: E731  (rank 0's own loss)
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sampler = GpuSampler(dev) if rank == 0 else None  # only rank 0's figures are printed
    dt, warm_s, first_loss, loss = _time(step, a, a.device, sampler)
    first_loss, loss = to_float(first_loss), to_float(loss)
    per_token = flops_per_token(
        num_layers=shape["layers"],
        hidden_size=shape["hidden"],
        seq_length=s,
        vocab_size=vocab,
        num_attention_heads=shape["heads"],
        num_query_groups=shape.get("kv_heads"),
        ffn_hidden_size=shape.get("ffn"),
        gated_linear_unit=shape.get("swiglu", False),
        num_experts=shape.get("experts"),
        moe_router_topk=shape.get("topk", 1),
        moe_ffn_hidden_size=shape.get("moe_ffn"),
        moe_shared_expert_intermediate_size=shape.get("shared_ffn"),
    )
    tokens_per_step = b * s * a.num_microbatches * dp  # global tokens (whole sequences under CP)
    tflops = per_token * tokens_per_step / dt / world / 1e12
    result = {
        "impl": "gigatron-" + (a.label or a.impl),
        "config": a.config,
        "gpus": world,
        "tp": a.tp,
        "sp": a.sp,
        "ep": a.ep,
        "shared_expert_overlap": a.moe_shared_expert_overlap,
        "dp": dp,
        "micro_batch": b,
        "seq": s,
        "iter_s": round(dt, 4),
        "ms_per_step": round(dt * 1e3, 1),
        "step": "fwd+bwd" if a.optimizer == "none" else "fwd+bwd+optimizer",
        "tokens_per_s": round(tokens_per_step / dt),
        "tflops_per_gpu": round(tflops, 1),
        "mfu": round(tflops * 1e12 / PEAK, 4),
        "peak_mem_gb": round(torch.cuda.max_memory_allocated() / 2**30, 1)
        if a.device == "cuda"
        else None,
        "loss": round(loss, 4),
        # rank 0's GPU during the timed steps (None off CUDA / without nvidia-smi): at the power
        # limit the SM clock, hence the GEMMs' speed, depends on the data (s7 report)
        "gpu_power": sampler.summary() if sampler else None,
        "warmup_s": round(warm_s, 1),
        "pp": a.pp,
        "vpp": a.vpp,
        "cp": a.cp,
        "cp_comm_type": a.cp_comm_type if a.cp > 1 else None,
        "num_microbatches": a.num_microbatches,
        "first_loss": first_loss,
        "init": a.init,
        "switches": {
            "spec": a.spec,
            "compile": a.compile,
            "fullgraph": a.fullgraph,
            "inductor_tuning": a.inductor_tuning,
            "compile_mode": a.compile_mode,
            "input_checks": not a.no_input_checks,
            "ce": a.ce,
            "fp8": f"{a.fp8_format}/{a.fp8}" if a.fp8 else None,
            "sdpa": a.sdpa,
            "ddp": use_ddp,
            "overlap_grad_reduce": a.overlap_grad_reduce,
            "grad_acc_fusion": a.grad_acc_fusion,
            "bucket_size": a.bucket_size,
            "optimizer": a.optimizer,
            "experts": a.experts if shape.get("experts") else None,
            "aux_loss_coeff": a.aux_loss_coeff if shape.get("experts") else None,
            "tp_comm_overlap": a.tp_comm_overlap,
            "async_tp": a.async_tp,
            "tp_comm_ce": a.tp_comm_ce,
            "gelu": a.gelu,
            "layers_per_graph": a.layers_per_graph,
            "row_bias_in_gemm": a.row_bias_in_gemm,
            "anchor_init": a.anchor_init,
            "comm_reorder": a.comm_reorder,
            "memory_reorder": not a.no_memory_reorder,
            "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
            "sm_carveout": a.sm_carveout,
            "nccl_high_priority": os.environ.get("TORCH_NCCL_HIGH_PRIORITY"),
        },
        "shape": shape,
        "versions": _versions(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    if a.sync_debug and a.device == "cuda":
        result["host_syncs"] = host_syncs(step)  # source lines, the first 20
        result["host_sync_count"] = len(result["host_syncs"])
    if a.profile and a.device == "cuda":
        # Every rank steps (collectives); rank 0 writes.
        result["profile"] = profile_step(
            step, a.profile if rank == 0 else None, dt, trace=a.trace if rank == 0 else None
        )
    if rank == 0:
        print("RESULT", json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
