"""bench_gpt.py experiments keep the numbers (fp32, CPU). --row-bias-in-gemm (for the residual +
LayerNorm kernel): the attention proj and dense MLP fc2 add their own bias (TP = 1: inside the
linear's GEMM), SelfAttention / MLP return no bias, loss and every grad equal the default model's.
--ce chunked-grad-in-forward: the same against --ce chunked."""

import pytest
import torch

from bench._lib import args as _bench_args
from bench.gpt import bench_gpt
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures()


def _loss_and_grads(flags):
    a = _bench_args.parse_args(["--config", "tiny", "--device", "cpu", *flags])
    torch.manual_seed(0)
    shape = dict(_bench_args.CONFIGS["tiny"])
    model, _ = bench_gpt.build_model(shape, a)
    g = torch.Generator().manual_seed(1)
    batch = (2, shape["seq"])
    tokens, labels = (torch.randint(0, shape["vocab"], batch, generator=g) for _ in "ab")
    pos = torch.arange(shape["seq"]).unsqueeze(0).expand(2, -1)
    loss = model(tokens, pos, None, labels=labels).mean()
    loss.backward()
    return model, loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_row_bias_in_gemm_keeps_the_numbers():
    plain, loss, grads = _loss_and_grads([])
    moved, moved_loss, moved_grads = _loss_and_grads(["--row-bias-in-gemm"])
    layer = moved.decoder.layers[0]
    assert not layer.self_attention.linear_proj.skip_bias_add
    assert not layer.mlp.linear_fc2.skip_bias_add
    assert plain.decoder.layers[0].self_attention.linear_proj.skip_bias_add
    hidden = torch.randn(8, 2, plain.config.hidden_size)  # [s, b, h]
    assert layer.mlp(hidden)[1] is None and plain.decoder.layers[0].mlp(hidden)[1] is not None
    torch.testing.assert_close(moved_loss, loss, rtol=1e-6, atol=1e-6)
    assert moved_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(moved_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_ce_grad_in_forward_keeps_the_numbers():
    """--ce chunked-grad-in-forward (bench): the mean loss's grads equal the chunked path's."""
    base, loss, grads = _loss_and_grads(["--ce", "chunked"])
    fused, fused_loss, fused_grads = _loss_and_grads(["--ce", "chunked-grad-in-forward"])
    assert fused.config.cross_entropy_fusion_impl == "native_grad_in_forward"
    assert base.config.cross_entropy_fusion_impl == "native"
    torch.testing.assert_close(fused_loss, loss, rtol=1e-6, atol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_anchor_init_draws_the_anchor_distributions():
    """--anchor-init: PyTorch's module defaults (the anchor's model), not Megatron's init."""
    a = _bench_args.parse_args(["--config", "tiny", "--device", "cpu", "--anchor-init"])
    torch.manual_seed(0)
    model, _ = bench_gpt.build_model(dict(_bench_args.CONFIGS["tiny"]), a)
    params = dict(model.named_parameters())
    emb = params["embedding.word_embeddings.weight"]
    assert 0.9 < emb.std().item() < 1.1  # N(0, 1), Megatron's is N(0, 0.02)
    fc2 = params["decoder.layers.0.mlp.linear_fc2.weight"]  # [h, 4h]
    bound = fc2.shape[1] ** -0.5
    assert fc2.abs().max().item() <= bound and fc2.abs().max().item() > 0.9 * bound
    assert params["decoder.layers.0.mlp.linear_fc2.bias"].abs().max().item() > 0  # Megatron: 0
    assert torch.equal(params["decoder.final_layernorm.weight"], torch.ones_like(emb[0]))
    for layout in (["--tp", "2"], ["--pp", "2"]):
        with pytest.raises(ValueError, match="--anchor-init needs --tp 1 and --pp 1"):
            _bench_args.parse_args(
                ["--config", "tiny", "--device", "cpu", "--anchor-init", *layout]
            )
