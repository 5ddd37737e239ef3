"""bench_gpt.py's pipeline (PP, interleaved VPP) and context-parallel (CP) training step.

The step a Megatron training loop runs (megatron.training.training.train_step): this rank's model
chunk(s) wrapped in DDP, `get_forward_backward_func()` over `num_microbatches` micro-batches
(1F1B, interleaved 1F1B, or no pipelining), `finalize_model_grads` (DP x CP grad reduction, the
tied-embedding all-reduce between first and last stage), then the optimizer step. Every
micro-batch is the same random batch (throughput does not depend on the data), already cut to
this rank's CP slice with `get_batch_on_this_cp_rank`, so the step's loss equals the one-rank
loss of that batch in any layout.
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps

# b: micro-batch, s: sequence, s_local: s / cp on this rank


def build_chunks(build_model, shape: dict, a) -> tuple[list[torch.nn.Module], object]:
    """This rank's model chunk(s), one per virtual stage, as training.get_model builds them.

    `build_model(shape, a, pre_process=, post_process=, vp_stage=, config=)` -> (model, config);
    every chunk shares the first chunk's config (the schedule reads hooks from it).
    """
    vp = ps.get_virtual_pipeline_model_parallel_world_size()
    chunks, cfg = [], None
    for vp_stage in range(vp or 1):
        pre = ps.is_pipeline_first_stage(ignore_virtual=vp is None, vp_stage=vp_stage)
        post = ps.is_pipeline_last_stage(ignore_virtual=vp is None, vp_stage=vp_stage)
        chunk, cfg = build_model(
            shape,
            a,
            pre_process=pre,
            post_process=post,
            vp_stage=vp_stage if vp is not None else None,
            config=cfg,
        )
        chunks.append(chunk)
    return chunks, cfg


def wrap_ddp(chunks: list, cfg, ddp_cfg) -> list:
    """DDP per chunk (bucketing only on the first chunk of the first stage, as in Megatron) and
    the config hooks the schedule calls: no_sync, grad_sync (overlap + VPP), finalize."""
    from gigatron.core.distributed import DistributedDataParallel, finalize_model_grads

    wrapped = [
        DistributedDataParallel(
            cfg,
            ddp_cfg,
            chunk,
            disable_bucketing=(i > 0) or ps.get_pipeline_model_parallel_rank() > 0,
        )
        for i, chunk in enumerate(chunks)
    ]
    no_sync = [m.no_sync for m in wrapped]
    cfg.no_sync_func = no_sync[0] if len(wrapped) == 1 else no_sync
    if ddp_cfg.overlap_grad_reduce and len(wrapped) > 1:
        cfg.grad_sync_func = [m.start_grad_sync for m in wrapped]
    cfg.finalize_model_grads_func = finalize_model_grads
    return wrapped


def cp_batch(tokens, labels, pos) -> dict:
    """{tokens, labels, position_ids} [b, s] -> this CP rank's [b, s_local] (load-balanced)."""
    from gigatron.core.utils import get_batch_on_this_cp_rank

    return get_batch_on_this_cp_rank({"tokens": tokens, "labels": labels, "position_ids": pos})


def _loss_func(output: torch.Tensor):
    """Per-token loss [b, s_local] -> (sum, token count, report [sum, count]) (pretrain_gpt's)."""
    losses = output.float()
    total = losses.sum()
    report = torch.cat([total.detach().view(1), total.detach().new_full((1,), losses.numel())])
    return total, losses.numel(), {"lm loss": report}


def _forward_step(data_iterator, model):
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, _loss_func  # [b, s_local] per-token loss on the last stage, else [s, b, h]


class PipelineStep:
    """One step through the schedule; returns this rank's [loss sum, token count] (zeros off
    the last stage). `report_loss` turns it into the global mean loss on every rank."""

    def __init__(self, chunks, opt, batch: dict, sdpa_ctx, *, num_microbatches, seq, mbs):
        from gigatron.core.pipeline_parallel import get_forward_backward_func

        self.chunks, self.opt, self.batch, self.sdpa_ctx = chunks, opt, batch, sdpa_ctx
        self.num_microbatches, self.seq, self.mbs = num_microbatches, seq, mbs
        self.params = [p for c in chunks for p in c.parameters() if p.requires_grad]
        self.forward_backward = get_forward_backward_func()
        self.zeros = torch.zeros(2, device=batch["tokens"].device)

    def __call__(self) -> torch.Tensor:
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.opt.zero_grad(set_to_none=True)
        iterators = [itertools.repeat(self.batch) for _ in self.chunks]
        with self.sdpa_ctx():
            reports = self.forward_backward(
                forward_step_func=_forward_step,
                data_iterator=iterators if len(iterators) > 1 else iterators[0],
                model=self.chunks,
                num_microbatches=self.num_microbatches,
                seq_length=self.seq,
                micro_batch_size=self.mbs,
                forward_only=False,
            )
        for p in self.params:  # DDP reduced the grads into its buffer (param.main_grad)
            p.grad = p.main_grad
        self.opt.step()
        if not reports:
            return self.zeros
        return torch.stack([r["lm loss"] for r in reports]).sum(0)  # [2]


def report_loss(local: torch.Tensor) -> float:
    """Mean per-token loss of the step: [sum, count] summed over CP ranks (sequence slices) and
    PP stages (only the last holds it). Collective: every rank calls it."""
    total = local.detach().clone().float()
    dist.all_reduce(total, group=ps.get_context_parallel_group())
    dist.all_reduce(total, group=ps.get_pipeline_model_parallel_group())
    return float(total[0] / total[1])
