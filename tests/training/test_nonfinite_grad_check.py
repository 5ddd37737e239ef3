"""The training loop's NaN/Inf gradient check (`_nonfinite_grad_ranks`): one min/max pass per
DDP grad buffer (or per grad without DDP) finds NaN, +Inf and -Inf anywhere, in fp32 and bf16
grads, and nothing in finite grads; one rank of a gloo world here (the DP = 2 skip / stop
behaviour is tests/training/test_training_loop.py's)."""

import pytest
import torch

from gigatron.training._train_step import _grad_tensors, _nonfinite_grad_ranks
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures()


def _ddp_model(grad_fp32: bool):
    from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from gigatron.core.models.gpt import GPTModel
    from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from gigatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, bf16=True)
    model = GPTModel(cfg, get_gpt_layer_local_spec(), 64, 16).to(torch.bfloat16)
    ddp_cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=grad_fp32, bucket_size=2000)
    return DistributedDataParallel(cfg, ddp_cfg, model)


@pytest.mark.parametrize("grad_fp32", [True, False])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_ddp_buffers_checked_in_one_pass_find_every_nonfinite_value(grad_fp32, bad):
    ddp = _ddp_model(grad_fp32)
    params = [p for p in ddp.parameters() if p.requires_grad]
    assert len(_grad_tensors([ddp])) == len(ddp.buffers) < len(params)  # flat buffers, not params
    for p in params:
        p.main_grad.normal_()
    assert _nonfinite_grad_ranks([ddp]) == []
    for p in (params[0], params[len(params) // 2], params[-1]):
        keep = p.main_grad.clone()
        p.main_grad.view(-1)[-1] = bad
        assert _nonfinite_grad_ranks([ddp]) == [0]
        p.main_grad.copy_(keep)
    assert _nonfinite_grad_ranks([ddp]) == []


def test_plain_module_grads_are_checked_per_param():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model(torch.randn(3, 4)).sum().backward()
    assert _nonfinite_grad_ranks([model]) == []
    model[1].bias.grad[0] = float("nan")
    assert _nonfinite_grad_ranks([model]) == [0]


def test_expert_buffers_and_grads_outside_the_buffers_are_checked():
    """Expert-parallel params (allreduce=False) live in DDP's expert buffers; a param frozen
    when DDP was built and unfrozen later keeps its grad in .grad, outside every buffer."""
    from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from gigatron.core.transformer.transformer_config import TransformerConfig

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    for p in model[1].parameters():
        p.allreduce = False  # expert-parallel
    model[2].weight.requires_grad_(False)
    cfg = TransformerConfig(num_layers=1, hidden_size=4, num_attention_heads=1)
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(), model)
    assert ddp.expert_parallel_buffers
    model[2].weight.requires_grad_(True)  # unfrozen after wrapping: not in any buffer
    ddp.zero_grad_buffer()
    ddp(torch.randn(3, 4)).sum().backward()
    assert model[2].weight.grad is not None
    assert _nonfinite_grad_ranks([ddp]) == []
    model[1].weight.main_grad.view(-1)[0] = float("inf")  # in the expert buffer
    assert _nonfinite_grad_ranks([ddp]) == [0]
    model[1].weight.main_grad.zero_()
    model[2].weight.grad[0, 0] = float("nan")  # outside the buffers
    assert _nonfinite_grad_ranks([ddp]) == [0]
