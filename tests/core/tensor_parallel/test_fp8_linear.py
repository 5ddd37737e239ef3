"""FP8 ColumnParallelLinear / RowParallelLinear (gigatron.core.fp8_utils, tensor_parallel/
fp8_linear.py): the one-rank GEMMs equal torchao's Float8Linear bitwise and sit within FP8's
error of fp32; at TP 2 (with and without SP, with the weight gradient fused into main_grad) every
output and gradient equals the one-rank FP8 result (amax reduced over TP: same scales), to 1e-6
per tensor and to bf16 rounding of the TP partial sums per row."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("torchao.float8")

from gigatron.core import parallel_state  # noqa: E402
from gigatron.core.fp8_utils import cpu_takes_rowwise_scales, get_fp8_recipe  # noqa: E402
from gigatron.core.model_parallel_config import ModelParallelConfig  # noqa: E402
from gigatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from gigatron.core.tensor_parallel.fp8_linear import Fp8LinearFunction  # noqa: E402
from gigatron.testing import run_distributed  # noqa: E402

pytestmark = pytest.mark.multirank

S, B, H, F_OUT = 8, 2, 32, 48  # sequence, batch, in features, out features
# the row-wise recipes run on CPU where this torch's CPU _scaled_mm takes per-row scales (2.13)
ROWWISE_ON_CPU = pytest.mark.skipif(
    not cpu_takes_rowwise_scales(), reason="this torch's CPU _scaled_mm takes per-tensor scales"
)
RECIPES = (
    "tensorwise",
    pytest.param("rowwise", marks=ROWWISE_ON_CPU),
    pytest.param("rowwise_with_gw_hp", marks=ROWWISE_ON_CPU),
)


def _recipe(name, fmt="hybrid", margin=0, wgrad=True):
    cfg = SimpleNamespace(fp8=fmt, fp8_recipe=name, fp8_margin=margin, fp8_wgrad=wgrad)
    return get_fp8_recipe(cfg)


def _rand(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _fp8_run(recipe, x, w, g, bias=None):
    """One rank, no communication: (y, dx, dw) of the FP8 linear."""
    x = x.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True)
    y = Fp8LinearFunction.apply(x, w, bias, recipe, "column", False, False, False, None)
    (y * g).sum().backward()
    return y.detach(), x.grad, w.grad


@pytest.mark.parametrize("name", RECIPES)
def test_gemms_equal_torchao_float8_linear(name):
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    x, w, g = _rand(1, S * B, H), _rand(2, F_OUT, H) * 0.2, _rand(3, S * B, F_OUT)
    fmt = "hybrid" if name == "tensorwise" else "e4m3"  # torchao's gradient dtype per recipe
    y, dx, dw = _fp8_run(_recipe(name, fmt), x, w, g)
    lin = torch.nn.Linear(H, F_OUT, bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    ao = Float8Linear.from_float(lin, config=Float8LinearConfig.from_recipe_name(name))
    ref_x = x.clone().requires_grad_(True)
    (ao(ref_x) * g).sum().backward()
    torch.testing.assert_close(y, ao(x).detach(), rtol=0, atol=0)
    torch.testing.assert_close(dx, ref_x.grad, rtol=0, atol=0)
    torch.testing.assert_close(dw, ao.weight.grad, rtol=0, atol=0)


@pytest.mark.parametrize("name", RECIPES)
@pytest.mark.parametrize("fmt", ["e4m3", "hybrid"])
def test_gemms_within_fp8_error_of_fp32(name, fmt):
    x, w, g = _rand(4, S * B, H), _rand(5, F_OUT, H) * 0.2, _rand(6, S * B, F_OUT)
    y, dx, dw = _fp8_run(_recipe(name, fmt), x, w, g)
    ref_x, ref_w = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    ref_y = ref_x @ ref_w.t()
    (ref_y * g).sum().backward()

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()

    # e4m3 keeps 3 mantissa bits (relative rounding <= 2^-4), e5m2 2 bits (<= 2^-3)
    grad_tol = 0.08 if fmt == "e4m3" else 0.12
    assert 1e-4 < rel(y, ref_y) < 0.06
    assert rel(dx, ref_x.grad) < grad_tol
    assert rel(dw, ref_w.grad) < (1e-6 if name == "rowwise_with_gw_hp" else grad_tol)


def test_margin_and_high_precision_wgrad():
    x, w, g = _rand(7, S * B, H), _rand(8, F_OUT, H) * 0.2, _rand(9, S * B, F_OUT)
    y0, _, dw0 = _fp8_run(_recipe("tensorwise"), x, w, g)
    y1, _, dw1 = _fp8_run(_recipe("tensorwise", margin=2), x, w, g)
    assert not torch.equal(y0, y1)  # other scales, other rounding
    _, _, dw_hp = _fp8_run(_recipe("tensorwise", wgrad=False), x, w, g)
    torch.testing.assert_close(dw_hp, g.t() @ x)
    assert not torch.equal(dw0, dw_hp)


def test_gradient_gemms_take_operands_from_fp8_transpose():
    """The two gradient GEMMs get their transposed FP8 operands (dY^T, X^T, W^T) from
    `gigatron::fp8_transpose` (kept out of the casts' kernels under torch.compile): three calls
    per backward. (Compiled FP8 models equal eager: test_fp8_compile.py.)"""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountTransposes(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            CountTransposes.calls += "gigatron.fp8_transpose" in str(func)
            return func(*args, **(kwargs or {}))

    recipe = _recipe("tensorwise")
    x, w, g = _rand(0, S * B, H), _rand(1, F_OUT, H) * 0.1, _rand(2, S * B, F_OUT)
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    y = Fp8LinearFunction.apply(xr, wr, None, recipe, "column", False, False, False, None)
    with CountTransposes():
        (y * g).sum().backward()
    assert CountTransposes.calls == 3
    for a, b in zip((y.detach(), xr.grad, wr.grad), _fp8_run(recipe, x, w, g)):
        assert torch.equal(a, b)  # the dispatch mode changed nothing


def test_fp8_transpose_copies_bytes_and_never_aliases():
    """`fp8_transpose` (ATen on CPU) equals `.t().contiguous()` byte for byte, from a row-major
    tensor and from a transposed view, and always returns new storage (a custom op's output must
    not alias its input, even where `.t()` is already contiguous)."""
    from gigatron.core.tensor_parallel.fp8_transpose import fp8_transpose

    x = _rand(3, 5, 7).to(torch.float8_e5m2)
    for src in (x, x.t()):
        got = fp8_transpose(src)
        assert got.is_contiguous() and got.untyped_storage().data_ptr() != x.data_ptr()
        assert torch.equal(got.view(torch.uint8), src.t().contiguous().view(torch.uint8))


def _copy_shard(layer, full_weight, full_bias, dim, tp_rank, tp):
    n = full_weight.size(dim) // tp
    with torch.no_grad():
        layer.weight.copy_(full_weight.narrow(dim, tp_rank * n, n))
        if layer.bias is not None:
            layer.bias.copy_(full_bias if dim == 1 else full_bias[tp_rank * n : (tp_rank + 1) * n])


def _run_tp_parity(tp, name, sp, fused):
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    rank = parallel_state.get_tensor_model_parallel_rank()
    recipe = _recipe(name)
    solo = [dist.new_group([r]) for r in range(dist.get_world_size())][dist.get_rank()]
    cfg = ModelParallelConfig(
        tensor_model_parallel_size=tp, sequence_parallel=sp, use_cpu_initialization=True,
        gradient_accumulation_fusion=fused,
    )  # fmt: skip
    solo_cfg = ModelParallelConfig(use_cpu_initialization=True, gradient_accumulation_fusion=fused)
    x_full, g_full = _rand(11, S, B, H), _rand(12, S, B, F_OUT)
    w_col, b_col = _rand(13, F_OUT, H) * 0.2, _rand(14, F_OUT)
    w_row, b_row = _rand(15, F_OUT, F_OUT) * 0.2, _rand(16, F_OUT)
    rows = slice(rank * S // tp, (rank + 1) * S // tp) if sp else slice(None)
    cols = slice(rank * F_OUT // tp, (rank + 1) * F_OUT // tp)

    def block(c, group, shard_rank, shards):
        """Column(H->F_OUT) then Row(F_OUT->F_OUT), the MLP pattern, on `group`."""
        zeros = torch.nn.init.zeros_
        col = ColumnParallelLinear(H, F_OUT, config=c, init_method=zeros, tp_group=group)
        row = RowParallelLinear(
            F_OUT, F_OUT, config=c, init_method=zeros, bias=True, input_is_parallel=True,
            skip_bias_add=False, tp_group=group,
        )  # fmt: skip
        _copy_shard(col, w_col, b_col, 0, shard_rank, shards)
        _copy_shard(row, w_row, b_row, 1, shard_rank, shards)
        col.fp8_recipe = row.fp8_recipe = recipe
        return col, row

    def run(col, row, x, g):
        x = x.clone().requires_grad_(True)
        if fused:
            for lin in (col, row):
                lin.weight.main_grad = torch.zeros_like(lin.weight)
        y, _ = row(col(x)[0])
        (y * g).sum().backward()
        grads = [lin.weight.main_grad if fused else lin.weight.grad for lin in (col, row)]
        return y.detach(), x.grad, grads, col.bias.grad, row.bias.grad

    ref = run(*block(solo_cfg, solo, 0, 1), x_full, g_full)
    got = run(*block(cfg, None, rank, tp), x_full[rows], g_full[rows])
    row_bias_grad = got[4].clone()
    if sp:  # each rank saw only its tokens: finalize_model_grads sums this over TP
        dist.all_reduce(row_bias_grad)
    pairs = [
        (got[0], ref[0][rows]),
        (got[1], ref[1][rows]),
        (got[2][0], ref[2][0][cols]),
        (got[2][1], ref[2][1][:, cols]),
        (got[3], ref[3][cols]),
        (row_bias_grad, ref[4]),
    ]
    return max(((a - b).abs() / (1 + b.abs())).max().item() for a, b in pairs)


@pytest.mark.multirank
@pytest.mark.parametrize(
    "name,sp,fused",
    [
        ("tensorwise", False, False),
        ("tensorwise", True, True),
        pytest.param("rowwise", True, False, marks=ROWWISE_ON_CPU),
    ],
)
def test_tp2_equals_one_rank(name, sp, fused):
    errs = run_distributed(_run_tp_parity, 2, args=(2, name, sp, fused))
    # Same scales at TP 2 as on one rank. Row-wise GEMMs return bf16 (torchao's workaround for
    # _scaled_mm's missing fp32 row-wise output), so the partial sums TP adds are bf16-rounded.
    tol = 1e-6 if name == "tensorwise" else 2**-6
    assert max(errs) <= tol, errs
