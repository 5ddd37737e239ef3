"""`gradient_accumulation_fusion` under gigatron's DDP: the linears add dW straight into
`main_grad` (eager, and compiled layers, where DDP's hook learns it from the layers' mark).

DP = 2 gloo ranks, a 2-layer GPTModel with tied embeddings (the output layer's grad of the
shared weight still arrives as a plain .grad) or untied ones with the chunked output layer +
cross entropy (its dW of the marked output weight must reach main_grad), DDP with overlap and
small buckets, two
micro-batches per step (the first under `no_sync`), two steps with an SGD update between:
every reduced `main_grad` equals the unfused eager run's (fp32; sums in another order only).
"""

import shutil

import pytest
import torch

from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


VOCAB, SEQ, MBS, HIDDEN = 96, 16, 2, 32


def _grads(fusion: bool, compile_backend: str | None, tied: bool):
    import torch.distributed as dist

    from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from gigatron.core.models.gpt import GPTModel
    from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from gigatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from gigatron.core.tensor_parallel.wgrad import WGRAD_IN_MAIN_GRAD
    from gigatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(
        num_layers=2,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        gradient_accumulation_fusion=fusion,
        cross_entropy_loss_fusion=not tied,
    )
    torch.manual_seed(0)
    model_parallel_cuda_manual_seed(0)
    model = GPTModel(
        cfg, get_gpt_layer_local_spec(), VOCAB, SEQ, share_embeddings_and_output_weights=tied
    )
    marked = [n for n, p in model.named_parameters() if getattr(p, WGRAD_IN_MAIN_GRAD, False)]
    if compile_backend is not None:
        for layer in model.decoder.layers:
            layer.compile(backend=compile_backend, fullgraph=True)
    ddp_config = DistributedDataParallelConfig(overlap_grad_reduce=True, bucket_size=6000)
    ddp = DistributedDataParallel(cfg, ddp_config, model)
    rank, grads = dist.get_rank(), []
    for step in range(2):
        ddp.zero_grad_buffer()
        for micro in range(2):
            gen = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
            tokens = torch.randint(0, VOCAB, (MBS, SEQ), generator=gen)
            pos = torch.arange(SEQ).unsqueeze(0).expand(MBS, SEQ)
            if micro == 0:
                with ddp.no_sync():
                    ddp(tokens, pos, None, labels=tokens).mean().backward()
            else:
                ddp(tokens, pos, None, labels=tokens).mean().backward()
        ddp.finish_grad_sync()
        grads.append({n: p.main_grad.clone() for n, p in model.named_parameters()})
        with torch.no_grad():
            for p in ddp.params_with_grad:
                p.sub_(0.1 * p.main_grad)
    return marked, grads


def _compare_all(cases):
    """`(marked, worst)` of each `(compile_backend, tied)` in `cases`, in one rank group (the
    unfused eager reference computed once per `tied`)."""
    from gigatron.core import parallel_state as ps

    torch.set_num_threads(1)
    ps.initialize_model_parallel()  # DP = 2
    references, out = {}, []
    for compile_backend, tied in cases:
        if tied not in references:
            references[tied] = _grads(False, None, tied)[1]
        marked, fused = _grads(True, compile_backend, tied)
        worst = 0.0
        for step, (got, ref) in enumerate(zip(fused, references[tied], strict=True)):
            assert got.keys() == ref.keys()
            for name in ref:
                torch.testing.assert_close(
                    got[name], ref[name], rtol=1e-5, atol=1e-6,
                    msg=f"{compile_backend} tied={tied} step {step} {name}",
                )  # fmt: skip
                worst = max(worst, (got[name] - ref[name]).abs().max().item())
        out.append((marked, worst))
    return out


def _check(cases):
    results = run_distributed(_compare_all, 2, args=(cases,), timeout=240)
    for i, (compile_backend, tied) in enumerate(cases):
        marked = results[0][i][0]
        # every linear weight of both layers (qkv, proj, fc1, fc2) and an untied output layer's,
        # never the embedding
        assert len(marked) == (8 if tied else 9), (compile_backend, tied, marked)
        assert not any("embedding" in n for n in marked), marked
        assert all(r[i][1] <= 1e-5 for r in results), (compile_backend, tied, results)


def test_wgrad_fusion_under_ddp_matches_unfused():
    """Eager and aot_eager-compiled layers, tied and untied (chunked CE) output weights."""
    _check([(backend, tied) for backend in (None, "aot_eager") for tied in (True, False)])


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile on CPU needs a C++ compiler")  # fmt: skip
def test_wgrad_fusion_under_ddp_inductor_matches_unfused():
    _check([("inductor", True), ("inductor", False)])
