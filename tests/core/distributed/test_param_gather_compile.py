"""`overlap_param_gather` (distributed optimizer) under torch.compile, DP = 2 on gloo ranks.

DDP waits for each unit's param all-gather in a forward pre-hook. A hook traced inside a
compiled graph guarded on the identity of every param it looked up, so each TransformerLayer
recompiled until dynamo's recompile limit (8) and the remaining layers ran eagerly
(`pretrain_gpt --overlap-param-gather --torch-compile model` on 2 GPUs logged
"hit config.recompile_limit"). The hooks are now never traced and sit on whole layers (or on a
compiled group of layers). Checked here for the eager model, the whole model compiled, each layer
compiled and layers compiled in groups of 2: the losses and the final weights equal the eager
model's without `overlap_param_gather` (fp32), the layers' graphs are compiled once for all
layers (not once per layer), and the hooks sit on the units, not on every module.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_fast_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from gigatron.core.transformer import TransformerConfig
from gigatron.core.transformer.fast_path import compile_transformer_layers
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


LAYERS, H, V, S, B, STEPS = 6, 32, 64, 16, 2, 3


class _Counter:
    """A dynamo backend ("eager": the graph's ops run as they are) counting compiled graphs."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def _train(mode: str, overlap_param_gather: bool):
    torch.manual_seed(0)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    config = TransformerConfig(
        num_layers=LAYERS,
        hidden_size=H,
        num_attention_heads=4,
        ffn_hidden_size=64,
        activation_func=F.gelu,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
    )
    model = GPTModel(config, get_gpt_layer_fast_spec(), V, S)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=True,
        overlap_param_gather=overlap_param_gather,
        use_distributed_optimizer=True,
        bucket_size=3000,  # several buckets, some spanning two layers
    )
    ddp = DistributedDataParallel(config, ddp_config, model)
    counter = _Counter()
    torch._dynamo.reset()
    if mode == "model":
        ddp.compile(backend=counter)
    elif mode == "layers":
        compile_transformer_layers(ddp, backend=counter)
    elif mode == "groups":
        compile_transformer_layers(ddp, layers_per_graph=2, backend=counter)
    hooked = sorted(
        name for name, m in model.named_modules() if m._forward_pre_hooks and name
    ) + sorted(
        f"{type(k[0]).__name__}[{k[1]}]"
        for k in ddp.remove_forward_pre_hook_handles
        if isinstance(k, tuple)
    )
    opt = get_megatron_optimizer(
        OptimizerConfig(
            lr=1e-2,
            use_distributed_optimizer=True,
            overlap_param_gather=overlap_param_gather,
            clip_grad=1.0,
        ),
        [ddp],
    )
    gen = torch.Generator().manual_seed(5 + torch.distributed.get_rank())
    losses = []
    for _ in range(STEPS):
        ids, labels = (torch.randint(0, V, (B, S), generator=gen) for _ in range(2))
        ddp.zero_grad_buffer()
        opt.zero_grad()
        if overlap_param_gather:
            ddp.start_param_sync()  # as the schedule's param_sync_func at the first microbatch
        loss = ddp(ids, None, None, labels=labels).mean()
        loss.backward()
        finalize_model_grads([ddp])
        ok, _, _ = opt.step()
        assert ok
        losses.append(loss.item())
    ddp.start_param_sync(force_sync=True)  # the last step's gather is still pending
    weights = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    return losses, weights, counter.graphs, hooked


def _run(mode, overlap):
    torch.set_num_threads(1)
    parallel_state.initialize_model_parallel()
    return _train(mode, overlap)


@pytest.mark.parametrize("mode", ["eager", "model", "layers", "groups"])
def test_overlap_param_gather_compiled_matches_eager(mode):
    ref = run_distributed(_run, 2, args=("eager", False), timeout=240)
    got = run_distributed(_run, 2, args=(mode, True), timeout=240)
    for rank in range(2):
        ref_losses, ref_weights, _, _ = ref[rank]
        losses, weights, graphs, hooked = got[rank]
        torch.testing.assert_close(losses, ref_losses, rtol=1e-6, atol=0)
        for name, want in ref_weights.items():
            torch.testing.assert_close(
                torch.from_numpy(weights[name]), torch.from_numpy(want), rtol=1e-6, atol=1e-7
            )
        # graphs: the layers' graph reused by every layer (one per group of layers), plus the
        # pieces of the model around the hooked modules outside the layers; before the fix the
        # whole model compiled 33 graphs (each layer its own, at every traced hook)
        most = {"eager": 0, "model": 12, "layers": 1, "groups": LAYERS // 2}[mode]
        assert graphs <= most, (mode, graphs)
        # one unit per layer (or per group of 2 layers), not every module that owns params
        layers = [f"decoder.layers.{i}" for i in range(LAYERS)]
        if mode == "groups":
            assert [h for h in hooked if h.startswith("TransformerBlock[")] == [
                f"TransformerBlock[{i}]" for i in range(LAYERS // 2)
            ], hooked
            assert not set(layers) & set(hooked), hooked
        else:
            assert set(layers) <= set(hooked), hooked
        assert not [h for h in hooked if h.startswith("decoder.layers.") and h not in layers]
