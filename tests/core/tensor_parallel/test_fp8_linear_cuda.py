"""FP8 linears on CUDA (issue 33): bf16 GEMMs on torch._scaled_mm equal torchao's Float8Linear
for each recipe and format, the weight gradient lands in an fp32 main_grad, a whole FP8 GPT is
one Dynamo graph on CUDA (no break, no recompile), and a compiled (Inductor) FP8 GPT step matches
the eager one within FP8 noise."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
pytest.importorskip("torchao.float8")

from gigatron.core.fp8_utils import get_fp8_recipe  # noqa: E402
from gigatron.core.tensor_parallel.fp8_linear import Fp8LinearFunction  # noqa: E402

N, H, F_OUT = 256, 128, 192


def _recipe(name, fmt):
    return get_fp8_recipe(SimpleNamespace(fp8=fmt, fp8_recipe=name, fp8_margin=0, fp8_wgrad=True))


def _inputs(seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(N, H, device="cuda", generator=g).bfloat16()
    w = (torch.randn(F_OUT, H, device="cuda", generator=g) * 0.1).bfloat16()
    dy = torch.randn(N, F_OUT, device="cuda", generator=g).bfloat16()
    return x, w, dy


@pytest.mark.parametrize(
    "name,fmt",
    [("tensorwise", "hybrid"), ("tensorwise", "e4m3"), ("rowwise", "e4m3"),
     ("rowwise", "hybrid"), ("rowwise_with_gw_hp", "e4m3")],
)  # fmt: skip
def test_bf16_gemms_equal_torchao(name, fmt):
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    x, w, dy = _inputs()
    xa, wa = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    recipe = _recipe(name, fmt)
    y = Fp8LinearFunction.apply(xa, wa, None, recipe, "column", False, False, False, None)
    y.backward(dy)
    ao_cfg = Float8LinearConfig.from_recipe_name(name)
    lin = torch.nn.Linear(H, F_OUT, bias=False, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(w)
    ao = Float8Linear.from_float(lin, config=ao_cfg)
    xb = x.clone().requires_grad_(True)
    yb = ao(xb)
    yb.backward(dy)
    torch.testing.assert_close(y, yb, rtol=0, atol=0)
    same_grads = fmt == ("hybrid" if name == "tensorwise" else "e4m3")  # torchao's grad dtype
    if same_grads:
        torch.testing.assert_close(xa.grad, xb.grad, rtol=0, atol=0)
        torch.testing.assert_close(wa.grad, ao.weight.grad, rtol=0, atol=0)
    ref = (dy.float().t() @ x.float()).norm()
    assert (wa.grad.float() - dy.float().t() @ x.float()).norm() / ref < 0.1


@pytest.fixture
def single_rank():
    """One gloo rank with parallel state and the model-parallel RNG seeded (as the other CUDA
    tests, e.g. tests/core/transformer/test_fast_path_cuda.py)."""
    import tempfile

    import torch.distributed as dist

    from gigatron.core import parallel_state, tensor_parallel

    if not dist.is_initialized():
        dist.init_process_group(
            "gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1
        )
    parallel_state.initialize_model_parallel(1, 1)
    torch.manual_seed(0)
    tensor_parallel.model_parallel_cuda_manual_seed(0)  # the tracker's model-parallel-rng
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    parallel_state.destroy_model_parallel()


def _gpt(spec="local", num_layers=2, fp8=True):
    from gigatron.core.models.gpt import GPTModel
    from gigatron.core.models.gpt import gpt_layer_specs as specs
    from gigatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(
        num_layers=num_layers, hidden_size=128, num_attention_heads=4, bf16=True,
        params_dtype=torch.bfloat16, fp8="hybrid" if fp8 else None, fp8_recipe="tensorwise",
        hidden_dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    layer_spec = getattr(specs, f"get_gpt_layer_{spec}_spec")()
    with torch.device("cuda"):
        model = GPTModel(cfg, layer_spec, 256, 64)
    return model.cuda()


def test_fp8_gpt_traces_as_one_graph(single_rank):
    """Dynamo alone (backend "eager"), this torch's tracing of the FP8 autograd function on CUDA:
    a whole 4-layer FP8 GPT (the benchmark's fast spec) is one graph, no break, no recompile."""
    from torch._dynamo.utils import counters

    counters.clear()
    model = _gpt("fast", num_layers=4)
    ids = torch.randint(0, 256, (2, 64), device="cuda")
    pos = torch.arange(64, device="cuda").expand(2, 64)

    def loss_fn(m):
        return m(ids, pos, None, labels=ids).float().mean()

    compiled = torch.compile(loss_fn, backend="eager", fullgraph=True)
    for _ in range(2):
        compiled(model).backward()
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"] and not counters["recompiles"]


def test_compiled_fp8_gpt_step_matches_eager(single_rank):
    """Inductor fuses the FP8 casts and amax reductions its own way, so the compiled step is not
    eager's bit for bit (a gradient of a small parameter can differ by ~10% of its norm). What
    must hold: the loss within 1%, and each compiled gradient no farther from the bf16 step's
    (the same weights without FP8) than twice eager FP8's distance plus 2% of the norm."""
    model = _gpt()
    bf16 = _gpt(fp8=False)
    bf16.load_state_dict(model.state_dict())
    ids = torch.randint(0, 256, (2, 64), device="cuda")
    pos = torch.arange(64, device="cuda").expand(2, 64)

    def step(m):
        m.zero_grad(set_to_none=True)
        loss = m(ids, pos, None, labels=ids).float().mean()
        loss.backward()
        return loss.detach(), [p.grad.float().clone() for p in m.parameters()]

    _, grads_ref = step(bf16)
    loss, grads = step(model)
    loss_c, grads_c = step(torch.compile(model))
    assert abs(loss.item() - loss_c.item()) < 1e-2 * abs(loss.item())
    for r, g, gc in zip(grads_ref, grads, grads_c, strict=True):
        assert (gc - r).norm() <= 2 * (g - r).norm() + 0.02 * r.norm() + 1e-6


def test_fp8_transpose_moves_bytes_exactly_eager_and_compiled():
    """The Triton tile transpose equals `.t().contiguous()` bit for bit, at shapes that are not
    multiples of its tile, from a transposed view too, and inside a compiled function."""
    from gigatron.core.tensor_parallel.fp8_transpose import fp8_transpose

    g = torch.Generator(device="cuda").manual_seed(0)
    for rows, cols in [(1, 1), (63, 130), (256, 192), (1000, 4097)]:
        x = torch.randn(rows, cols, device="cuda", generator=g).to(torch.float8_e4m3fn)
        for src in (x, x.t()):
            got = fp8_transpose(src)
            assert got.is_contiguous() and got.dtype == src.dtype
            assert torch.equal(got.view(torch.uint8), src.t().contiguous().view(torch.uint8))

    def cast_then_transpose(y):
        q = (y * 2.0).to(torch.float8_e5m2)
        return q, fp8_transpose(q)

    y = torch.randn(512, 384, device="cuda", generator=g, dtype=torch.bfloat16)
    q, qt = torch.compile(cast_then_transpose, fullgraph=True)(y)
    assert torch.equal(qt.view(torch.uint8), q.t().contiguous().view(torch.uint8))
