"""DDP `overlap_grad_reduce` really overlaps: bucket collectives start during backward.

Checked with an ordered event log (not timing) on 2 gloo ranks, for a 4-layer GPTModel with
a bucket of about one layer (>= 3 buckets), with eager layers and with every TransformerLayer
compiled by `torch.compile(backend="aot_eager", fullgraph=True)` (its backward hands over a
layer's param grads in one burst; the post-accumulate-grad hooks must still fire then):

- every layer is wrapped in a tap that logs `("start", i)` when the grad of its output arrives
  (its backward starts) and `("end", i)` when the grad of its input is ready (it is done);
- each bucket group's `start_grad_sync` logs `("launch", bucket)`.

Overlap is real when bucket 0 (the last layer's params) is launched before layer 0's backward
starts, and all buckets but the one holding the embeddings are launched before layer 0's
backward ends. Without overlap nothing is launched before `loss.backward()` returns. The
reduced grads of both runs must be equal to the last bit, over two iterations with an SGD step
in between.
"""

import pytest
import torch

from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


LAYERS, HIDDEN, VOCAB, SEQ, MBS = 4, 64, 128, 16, 2
BUCKET = 12 * HIDDEN * HIDDEN  # about one layer's params: 5 buckets here


class _Tap(torch.nn.Module):
    """Calls `layer`, logging when its backward starts and ends."""

    def __init__(self, layer, index, log):
        super().__init__()
        self.layer, self.index, self.log = layer, index, log

    def forward(self, hidden_states, **kwargs):
        if hidden_states.requires_grad:
            hidden_states.register_hook(lambda g: self.log.append(("end", self.index)))
        out, context = self.layer(hidden_states, **kwargs)
        out.register_hook(lambda g: self.log.append(("start", self.index)))
        return out, context


def _model(log, compiled):
    from gigatron.core.models.gpt import GPTModel
    from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from gigatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from gigatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    torch.manual_seed(0)
    model_parallel_cuda_manual_seed(0)
    model = GPTModel(
        cfg, get_gpt_layer_local_spec(), VOCAB, SEQ, share_embeddings_and_output_weights=True
    )
    layers = model.decoder.layers
    for i in range(len(layers)):
        if compiled:
            layers[i].compile(backend="aot_eager", fullgraph=True)
        layers[i] = _Tap(layers[i], i, log)
    return cfg, model


def _run(overlap, compiled):
    """Two iterations; returns (event log of the last one, reduced grads of both, buckets)."""
    import torch.distributed as dist

    from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    log = []
    cfg, model = _model(log, compiled)
    ddp_config = DistributedDataParallelConfig(overlap_grad_reduce=overlap, bucket_size=BUCKET)
    ddp = DistributedDataParallel(cfg, ddp_config, model)
    for index, group in enumerate(ddp.bucket_groups):
        launch = group.start_grad_sync

        def logged(*args, _launch=launch, _index=index, **kwargs):
            log.append(("launch", _index))
            return _launch(*args, **kwargs)

        group.start_grad_sync = logged
    emb = {id(p) for p in model.embedding.parameters()}
    embedding_buckets = [
        i for i, g in enumerate(ddp.bucket_groups) if any(id(p) in emb for p in g.params)
    ]
    rank = dist.get_rank()
    grads = []
    for it in range(2):
        gen = torch.Generator().manual_seed(100 * it + rank)
        tokens = torch.randint(0, VOCAB, (MBS, SEQ), generator=gen)
        pos = torch.arange(SEQ).unsqueeze(0).expand(MBS, SEQ)
        ddp.zero_grad_buffer()
        log.clear()
        loss = ddp(tokens, pos, None, labels=tokens).mean()
        loss.backward()
        log.append(("backward returned", -1))
        ddp.finish_grad_sync()
        grads.append([p.main_grad.clone() for p in ddp.params_with_grad])
        with torch.no_grad():
            for p in ddp.params_with_grad:
                p.sub_(0.1 * p.main_grad)
    return list(log), grads, len(ddp.bucket_groups), embedding_buckets


def _check_all():
    """Runs on each rank: eager and compiled, overlap vs no overlap."""
    from gigatron.core import parallel_state as ps

    ps.initialize_model_parallel()  # DP = 2
    for compiled in (False, True):
        log, grads, n_buckets, emb_buckets = _run(True, compiled)
        log_ref, grads_ref, n_ref, _ = _run(False, compiled)
        where = f"compiled={compiled}"
        assert n_buckets >= 3, (where, n_buckets)
        assert n_ref == 1, (where, n_ref)  # no overlap: one bucket, as in Megatron
        launches = [i for kind, i in log if kind == "launch"]
        assert sorted(launches) == list(range(n_buckets)), (where, log)
        assert launches == sorted(launches), (where, log)  # buckets start in backward order
        assert emb_buckets == [n_buckets - 1], (where, emb_buckets)
        at = {event: k for k, event in enumerate(log)}
        # Bucket 0 (last layer's params) starts before layer 0's backward has even begun ...
        assert at[("launch", 0)] < at[("start", 0)], (where, log)
        # ... and every bucket without embedding params before layer 0's backward is done.
        for b in range(n_buckets - 1):
            assert at[("launch", b)] < at[("end", 0)], (where, b, log)
        ref_at = {event: k for k, event in enumerate(log_ref)}
        assert ref_at[("launch", 0)] > ref_at[("backward returned", -1)], (where, log_ref)
        for it, (got, ref) in enumerate(zip(grads, grads_ref)):
            for k, (g, r) in enumerate(zip(got, ref)):
                assert torch.equal(g, r), (where, it, k, (g - r).abs().max().item())
    return True


def test_ddp_overlap_launches_buckets_during_backward_and_matches_no_overlap():
    assert run_distributed(_check_all, 2, timeout=120) == [True, True]
