"""`gigatron estimate`'s numbers for representative ranks: memory, FLOPs, communication, time.

Ranks that differ only in their data-parallel (and tensor / context / expert) coordinate hold
the same shapes and do the same work, so one rank per pipeline stage stands for all of them:
the first, middle and last stages at TP = CP = DP = 0 (`representative_ranks`). For each, the
rank's real model is built on meta inside a fake world (`world.py`), its memory estimated
(`memory.py`), and one microbatch per chunk traced (`trace.py`) for FLOPs, collective volume
and, with a calibration table, time (`timing.py`).
"""

from __future__ import annotations

from gigatron.core import parallel_state as ps
from gigatron.core.pipeline_parallel.schedule_plan import rank_steps_and_slots
from gigatron.core.tensor_parallel import model_parallel_cuda_manual_seed
from gigatron.tools.estimate import timing
from gigatron.tools.estimate.memory import Precision, precision_of, rank_memory
from gigatron.tools.estimate.trace import trace_chunk
from gigatron.tools.estimate.world import build_chunks, fake_rank

# bytes a rank sends per byte of a collective's (full) buffer, before the (n - 1) / n
_SEND_FACTOR = {"allreduce": 2.0, "allgather": 1.0, "reduce_scatter": 1.0, "alltoall": 1.0}


def dense_grid(args) -> ps.RankGenerator:
    """The TP x CP x DP x PP grid of the flags (Megatron's default order)."""
    tp, pp, cp = (
        args.tensor_model_parallel_size,
        args.pipeline_model_parallel_size,
        args.context_parallel_size,
    )
    dp = args.world_size // (tp * pp * cp)
    return ps.RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")


def representative_ranks(args) -> dict[str, int]:
    """{"first" | "middle" | "last": rank} of the pipeline group holding rank 0."""
    stages = next(g for g in dense_grid(args).get_ranks("pp") if 0 in g)
    out = {"first": stages[0]}
    if len(stages) > 2:
        out["middle"] = stages[len(stages) // 2]
    if len(stages) > 1:
        out["last"] = stages[-1]
    return out


def num_microbatches(args) -> int:
    return args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)


def _sent(kind: str, nbytes: int, size: int) -> float:
    if kind in ("send", "recv"):
        return nbytes if kind == "send" else 0
    return _SEND_FACTOR.get(kind, 1.0) * nbytes * (size - 1) / max(size, 1)


def _comm_volume(args, traces, mem: dict, prec: Precision, slots) -> dict[str, float]:
    """Bytes this rank sends per step, by group: the traced collectives (TP, CP, EP) times the
    microbatches, pipeline sends, and the gradient / parameter sync over DP."""
    vol: dict[str, float] = {}
    m = num_microbatches(args)
    for tr in traces:
        for kind, nbytes, size, group in tr.collectives:
            vol[group] = vol.get(group, 0.0) + m * _sent(kind, nbytes, size)
    sp_div = args.tensor_model_parallel_size if args.sequence_parallel else 1
    act_bytes = (
        (args.seq_length // args.context_parallel_size // sp_div)
        * args.micro_batch_size
        * args.hidden_size
        * prec.param
    )
    sends = sum(len(slot.sends) for slot in slots)
    if sends:
        vol["pp"] = vol.get("pp", 0.0) + sends * act_bytes
    dense = mem["params"] - mem["expert_params"]
    for group, n, size in (  # expert params sync over the expert-DP group
        ("dp", dense, ps.get_data_parallel_world_size(with_context_parallel=True)),
        ("expert_dp", mem["expert_params"], ps.get_expert_data_parallel_world_size()),
    ):
        if size > 1 and n:
            if args.use_distributed_optimizer:  # reduce-scatter grads, all-gather params
                sync = n * (prec.grad + prec.param) * (size - 1) / size
            else:
                sync = 2 * n * prec.grad * (size - 1) / size
            vol[group] = vol.get(group, 0.0) + sync
    return vol


def estimate_rank(
    args, rank: int, *, calibration=None, precision=None, keep_traces: bool = False
) -> dict:
    """Memory, FLOPs, communication and (with `calibration`) time of `rank`; `keep_traces`
    adds each chunk's `Trace` under "traces" (not JSON: for bench/estimate/calibrate.py)."""
    prec = precision or precision_of(args)
    with fake_rank(args, rank):
        model_parallel_cuda_manual_seed(args.seed)
        chunks = build_chunks(args)
        mem = rank_memory(args, chunks, prec)
        out = {
            "rank": rank,
            "pp_rank": ps.get_pipeline_model_parallel_rank(),
            "tp_rank": ps.get_tensor_model_parallel_rank(),
            "dp_rank": ps.get_data_parallel_rank(),
            "chunks": len(chunks),
            "layers": sum(len(c.decoder.layers) for c in chunks),
            **mem,
        }
        _, slots = rank_steps_and_slots(
            pp_size=ps.get_pipeline_model_parallel_world_size(),
            pp_rank=ps.get_pipeline_model_parallel_rank(),
            num_microbatches=num_microbatches(args),
            num_model_chunks=len(chunks),
        )
        try:
            traces = [
                trace_chunk(args, c, first=c.pre_process, last=c.post_process) for c in chunks
            ]
        except NotImplementedError as err:  # MoE routing needs real token counts
            out["trace_error"] = str(err).splitlines()[0]
            return out
        if keep_traces:
            out["traces"] = traces
        m = num_microbatches(args)
        out["flops_per_step"] = m * sum(t.gemm_flops + t.attention_flops for t in traces)
        out["comm_bytes_per_step"] = _comm_volume(args, traces, mem, prec, slots)
        if calibration is not None:
            out["time"] = timing.step_seconds(
                calibration,
                traces,
                num_microbatches=m,
                pp_size=ps.get_pipeline_model_parallel_world_size(),
                num_params=_optimizer_params(args, mem),
                optimizer_bytes_per_param=prec.update_traffic,
                grad_buffer_bytes=prec.grad * (mem["params"] + _optimizer_params(args, mem)),
            )
    return out


def _optimizer_params(args, mem: dict) -> int:
    """Parameters this rank's optimizer steps: its shard under the distributed optimizer (dense
    ones over DP x CP, expert ones over the expert-DP group, as `memory.rank_memory`)."""
    if not args.use_distributed_optimizer:
        return mem["params"]
    dense = mem["params"] - mem["expert_params"]
    return (
        dense // ps.get_data_parallel_world_size(with_context_parallel=True)
        + mem["expert_params"] // ps.get_expert_data_parallel_world_size()
    )


def estimate(args, *, calibration=None, precision=None) -> dict:
    """The whole report: layout, and each representative rank's numbers."""
    ranks = representative_ranks(args)
    return {
        "world_size": args.world_size,
        "layout": {
            "tp": args.tensor_model_parallel_size,
            "pp": args.pipeline_model_parallel_size,
            "vpp": args.virtual_pipeline_model_parallel_size,
            "cp": args.context_parallel_size,
            "ep": args.expert_model_parallel_size,
            "dp": args.data_parallel_size,
            "sequence_parallel": args.sequence_parallel,
            "distributed_optimizer": args.use_distributed_optimizer,
            "recompute": args.recompute_granularity,
            "num_microbatches": num_microbatches(args),
        },
        "ranks": {
            label: estimate_rank(args, r, calibration=calibration, precision=precision)
            for label, r in ranks.items()
        },
    }
