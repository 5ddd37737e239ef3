"""MoE GPT training-step throughput: SequentialMLP vs GroupedMLP experts, as JSON.

    python bench/moe/bench_moe.py --config moe-tiny --device cpu  # harness check (CPU, fp32)
    python bench/moe/bench_moe.py --config moe-8x-h200            # one GPU, bf16

An 8-expert top-2 Mixtral-style GPT (RoPE, RMSNorm, SwiGLU experts, GQA, no biases), built with
`get_gpt_layer_local_spec(num_experts=8, moe_grouped_gemm=...)`. Both expert implementations get
the same weights (GroupedMLP's are converted from the SequentialMLP model), so the bench also
reports the max logit difference between them. Timed: forward + backward of one micro-batch
(random tokens), `--warmup` untimed then the mean of `--iters` steps. The last line is
`RESULT {json}` (hardware, versions, config, date, per-implementation ms/step and tokens/s,
whether `torch._grouped_mm` ran); `--out FILE` also writes the JSON there.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time

import torch
import torch.distributed as dist

# the repo root: gigatron and bench.* import without an install
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CONFIGS = {
    "moe-tiny": dict(
        layers=2,
        hidden=64,
        heads=4,
        kv_heads=2,
        ffn=64,
        experts=8,
        topk=2,
        seq=32,
        mbs=2,
        vocab=512,
    ),
    # Mixtral-shaped, scaled to one H200: 8 layers, h 2048, 8 experts of ffn 4096, top-2.
    "moe-8x-h200": dict(
        layers=8,
        hidden=2048,
        heads=16,
        kv_heads=8,
        ffn=4096,
        experts=8,
        topk=2,
        seq=2048,
        mbs=4,
        vocab=50304,
    ),
}


def _build(cfg, grouped: bool, dtype, device):
    from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from gigatron.core.models.gpt.gpt_model import GPTModel
    from gigatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=cfg["layers"],
        hidden_size=cfg["hidden"],
        num_attention_heads=cfg["heads"],
        num_query_groups=cfg["kv_heads"],
        ffn_hidden_size=cfg["ffn"],
        moe_ffn_hidden_size=cfg["ffn"],
        num_moe_experts=cfg["experts"],
        moe_router_topk=cfg["topk"],
        moe_aux_loss_coeff=1e-2,
        moe_grouped_gemm=grouped,
        moe_token_dispatcher_type="alltoall",
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=device.type == "cpu",
    )
    spec = get_gpt_layer_local_spec(num_experts=cfg["experts"], moe_grouped_gemm=grouped)
    model = GPTModel(
        config,
        spec,
        vocab_size=cfg["vocab"],
        max_sequence_length=cfg["seq"],
        position_embedding_type="rope",
    )
    return model.to(device)


def _copy_to_grouped(seq_model, grp_model, num_layers, num_experts):
    """Load the SequentialMLP model's weights into the GroupedMLP model."""
    from gigatron.core.transformer.moe.experts import grouped_weights_from_sequential

    sd = {k: v for k, v in seq_model.state_dict().items() if ".local_experts." not in k}
    full = seq_model.state_dict()
    for i in range(num_layers):
        p = f"decoder.layers.{i}.mlp.experts."
        fc1 = [full[f"{p}local_experts.{e}.linear_fc1.weight"] for e in range(num_experts)]
        fc2 = [full[f"{p}local_experts.{e}.linear_fc2.weight"] for e in range(num_experts)]
        sd[p + "weight1"], sd[p + "weight2"] = grouped_weights_from_sequential(fc1, fc2)
    missing, unexpected = grp_model.load_state_dict(sd, strict=False)
    bad = [k for k in missing + unexpected if not k.endswith("_extra_state")]
    if bad:
        raise RuntimeError(f"weight conversion left keys unmatched: {bad[:5]}")


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _time(model, ids, warmup, iters, device):
    model.train()
    for _ in range(warmup):
        model(ids, None, attention_mask=None, labels=ids).float().mean().backward()
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        model(ids, None, attention_mask=None, labels=ids).float().mean().backward()
    _sync(device)
    return (time.perf_counter() - start) / iters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="moe-tiny", choices=sorted(CONFIGS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--dtype", default=None, choices=["fp32", "bf16"], help="default: bf16 on CUDA, fp32 on CPU"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cfg = CONFIGS[args.config]
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)  # the first visible GPU
    dtype_name = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32

    from gigatron.core import parallel_state, tensor_parallel
    from gigatron.core.transformer.moe.experts import grouped_mm_available

    dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    torch.manual_seed(0)
    seq_model = _build(cfg, False, dtype, device)
    grp_model = _build(cfg, True, dtype, device)
    _copy_to_grouped(seq_model, grp_model, cfg["layers"], cfg["experts"])
    ids = torch.randint(0, cfg["vocab"], (cfg["mbs"], cfg["seq"]), device=device)
    with torch.no_grad():
        seq_model.eval(), grp_model.eval()
        diff = (
            (
                seq_model(ids, None, attention_mask=None).float()
                - grp_model(ids, None, attention_mask=None).float()
            )
            .abs()
            .max()
            .item()
        )
    w1 = grp_model.decoder.layers[0].mlp.experts.weight1
    x = torch.empty(1, cfg["hidden"], dtype=dtype, device=device)
    kernel = grouped_mm_available(x, w1.view(cfg["experts"], cfg["hidden"], -1))
    tokens = cfg["mbs"] * cfg["seq"]
    results = {}
    for name, model in (("sequential", seq_model), ("grouped", grp_model)):
        sec = _time(model, ids, args.warmup, args.iters, device)
        results[name] = dict(ms_per_step=sec * 1e3, tokens_per_s=tokens / sec)
    report = dict(
        bench="bench_moe",
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        device=torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        torch=torch.__version__,
        python=platform.python_version(),
        config=dict(name=args.config, dtype=dtype_name, **cfg),
        step="forward+backward, 1 micro-batch, alltoall dispatcher (EP=1)",
        warmup=args.warmup,
        iters=args.iters,
        grouped_mm_kernel=kernel,
        max_abs_logit_diff_grouped_vs_sequential=diff,
        results=results,
        speedup_grouped_over_sequential=results["sequential"]["ms_per_step"]
        / results["grouped"]["ms_per_step"],
    )
    line = json.dumps(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(line + "\n")
    print("RESULT " + line)
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
