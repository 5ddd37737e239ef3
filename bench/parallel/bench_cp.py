"""Context-parallel attention benchmark: tokens/s, peak memory and ring overlap, as JSON.

    python bench/parallel/bench_cp.py --cp 2 --device cpu                  # tiny, gloo ranks
    torchrun --nproc-per-node 2 bench/parallel/bench_cp.py --cp 2 --device cuda --seq 131072 \
        --level gpt --config gpt-1.3b --dtype bf16 --recompute         # the GPU claim
    torchrun --nproc-per-node 2 bench/parallel/bench_cp.py --cp 2 --device cuda --seq 32768

For each cp_comm_type ("p2p", "all_gather", "a2a") one forward+backward of either the core
attention alone (`--level attention`, q/k/v of this rank's zigzag tokens) or a whole GPTModel
(`--level gpt`, learned positions, causal, loss backward) is timed: warm-up iterations, then the
mean of `--iters`. tokens/s counts the global sequence (all CP ranks) x batch.

Ring overlap (p2p, attention level): the same ring is also timed with the attention kernels
replaced by no-ops (communication alone, T_comm) and with the transfers replaced by local copies
(compute alone, T_compute); the share of communication hidden behind compute is
clamp((T_compute + T_comm - T_ring) / T_comm, 0, 1). The last line on rank 0 is `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import resource
import sys
import time

import torch
import torch.distributed as dist

# the repo root: gigatron and bench.* import without an install
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CONFIGS = {  # name -> (num_layers, hidden, heads, query groups, vocab)
    "tiny": (2, 64, 8, 4, 256),
    "gpt-1.3b": (24, 2048, 16, 16, 50304),
}
MODES = ("p2p", "all_gather", "a2a")


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cp", type=int, default=2)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--level", choices=["attention", "gpt"], default="attention")
    p.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    p.add_argument("--seq", type=int, default=256, help="global sequence length")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--recompute", action="store_true", help="full recompute of every layer")
    p.add_argument(
        "--recompute-layers",
        type=int,
        default=None,
        help="full recompute of only the first N layers of the stage (Megatron's block method)",
    )
    p.add_argument("--train", action="store_true", help="GPT level: also an AdamW step")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=3)
    return p.parse_args(argv)


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()
    dist.barrier()


def _time(fn, args) -> float:
    for _ in range(args.warmup):
        fn()
    _sync(args.device)
    start = time.perf_counter()
    for _ in range(args.iters):
        fn()
    _sync(args.device)
    return (time.perf_counter() - start) / args.iters


def _config(args, comm):
    from gigatron.core.transformer.transformer_config import TransformerConfig

    layers, hidden, heads, groups, _ = CONFIGS[args.config]
    recompute = args.recompute or args.recompute_layers is not None
    method, num = None, None
    if args.recompute_layers is not None:
        method, num = "block", args.recompute_layers
    elif args.recompute:
        method, num = "uniform", 1
    return TransformerConfig(
        num_layers=layers if args.level == "gpt" else 1,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=groups,
        context_parallel_size=args.cp,
        cp_comm_type=comm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=args.dtype == "bf16",
        recompute_granularity="full" if recompute else None,
        recompute_method=method,
        recompute_num_layers=num,
        params_dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32,
        pipeline_dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32,
    )


def _attention_step(args, comm):
    from gigatron.core.transformer.context_parallel import ContextParallelAttention
    from gigatron.core.transformer.enums import AttnMaskType

    cfg = _config(args, comm)
    attn = ContextParallelAttention(cfg, 1, AttnMaskType.causal, cp_comm_type=comm)
    s, dt = args.seq // args.cp, cfg.params_dtype
    hn, np_, ng = cfg.kv_channels, cfg.num_attention_heads, cfg.num_query_groups
    q = torch.randn(s, args.batch, np_, hn, device=args.device, dtype=dt, requires_grad=True)
    k = torch.randn(s, args.batch, ng, hn, device=args.device, dtype=dt, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)

    def step():
        attn(q, k, v, None).float().sum().backward()

    return step


def _gpt_step(args, comm):
    from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from gigatron.core.models.gpt.gpt_model import GPTModel
    from gigatron.core.transformer.context_parallel import ContextParallelAttention

    cfg = _config(args, comm)
    spec = get_gpt_layer_local_spec()  # Attention swaps in ContextParallelAttention (cp > 1)
    if args.cp == 1:  # still the CP module (its single-rank path), for like-for-like numbers
        spec.submodules.self_attention.submodules.core_attention = ContextParallelAttention
    vocab = CONFIGS[args.config][4]
    model = GPTModel(cfg, spec, vocab, args.seq, position_embedding_type="learned_absolute")
    model = model.to(args.device)
    s = args.seq // args.cp
    tokens = torch.randint(0, vocab, (args.batch, s), device=args.device)
    pos = torch.arange(s, device=args.device)[None] + dist.get_rank() * s  # any in-range ids

    opt = None
    if args.train:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=args.device == "cuda")

    def step():
        model.zero_grad(set_to_none=True)
        model(tokens, pos, None, labels=tokens).mean().backward()
        if opt is not None:  # CP ranks hold the same weights: sum their grads first
            for param in model.parameters():
                dist.all_reduce(param.grad, group=_cp_group())
            opt.step()

    return step


def _cp_group():
    from gigatron.core import parallel_state as ps

    return ps.get_context_parallel_group()


def _null_forward(q, k, v, *unused):
    """Kernel stand-in for timing communication alone: right shapes, no math."""
    return q.new_zeros(q.shape).float(), q.new_zeros(q.shape[:-1]).float(), None


def _null_backward(dout, out, delta, q, k, v, *unused):
    return q.new_zeros(q.shape).float(), k.new_zeros(k.shape).float(), v.new_zeros(v.shape).float()


def _ring_overlap(args, step, ra, kernels):
    """(T_ring, T_comm alone, T_compute alone, hidden share) of the p2p attention step."""
    t_ring = _time(step, args)
    fwd, bwd, send_recv = kernels.block_forward, kernels.block_backward, ra._RingComm.send_recv
    kernels.block_forward, kernels.block_backward = _null_forward, _null_backward
    t_comm = _time(step, args)
    kernels.block_forward, kernels.block_backward = fwd, bwd
    ra._RingComm.send_recv = lambda self, tensor, tag=0: (tensor.clone(), [])
    t_compute = _time(step, args)
    ra._RingComm.send_recv = send_recv
    hidden = (t_compute + t_comm - t_ring) / t_comm if t_comm > 0 else 0.0
    return dict(t_ring_s=t_ring, t_comm_s=t_comm, t_compute_s=t_compute,
                comm_hidden_share=min(max(hidden, 0.0), 1.0))  # fmt: skip


def _peak_mb(device) -> float:
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # process peak RSS


def run(args) -> dict:
    from gigatron.core import parallel_state as ps
    from gigatron.core.transformer.context_parallel import _kernels

    ra = importlib.import_module("gigatron.core.transformer.context_parallel.ring_attention")
    from gigatron.core import tensor_parallel

    ps.initialize_model_parallel(context_parallel_size=args.cp)
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    torch.manual_seed(0)
    results = {}
    step = None
    for comm in args.modes.split(","):
        step = None  # free the previous mode's model before building the next
        if args.device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            step = (_attention_step if args.level == "attention" else _gpt_step)(args, comm)
            seconds = _time(step, args)
        except (ValueError, torch.OutOfMemoryError) as err:
            results[comm] = {"error": f"{type(err).__name__}: {err}"[:300]}
            continue
        results[comm] = dict(
            step_s=seconds,
            tokens_per_s=args.seq * args.batch / seconds,
            peak_memory_mb=_peak_mb(args.device),
        )
        if comm == "p2p" and args.level == "attention" and args.cp > 1:
            results[comm].update(_ring_overlap(args, step, ra, _kernels))
    ps.destroy_model_parallel()
    return results


def _environment(args) -> dict:
    env = {"torch": torch.__version__, "python": platform.python_version(),
           "machine": platform.machine(), "cpus": os.cpu_count()}  # fmt: skip
    if args.device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
    return env


def _report(args, results) -> None:
    out = dict(bench="bench_cp", date=datetime.datetime.now(datetime.UTC).isoformat(),
               config=vars(args), environment=_environment(args), results=results)  # fmt: skip
    print("RESULT", json.dumps(out), flush=True)


def _worker(argv):
    return run(_args(argv))


def main(argv=None) -> None:
    args = _args(argv)
    if "WORLD_SIZE" in os.environ:  # torchrun: one process per rank
        backend = "nccl" if args.device == "cuda" else "gloo"
        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)
        results = run(args)
        if dist.get_rank() == 0:
            _report(args, results)
        dist.destroy_process_group()
        return
    if args.device == "cuda":
        raise SystemExit("--device cuda needs torchrun (one process per GPU)")
    from gigatron.testing import run_distributed

    results = run_distributed(_worker, args.cp, args=(argv,), timeout=600)[0]
    _report(args, results)


if __name__ == "__main__":
    main(sys.argv[1:])
