"""torch.compile(fullgraph=True) of tensor-parallel code on 2 gloo ranks: a TP = 2 GPT
TransformerLayer (with and without sequence parallelism), a whole tiny GPTModel, the mappings
and the linears' gradient-accumulation-fusion path give the eager numbers (fp32, 1e-6) for
outputs, input grads and every weight grad. The compiled graph holds the collectives as
`_c10d_functional` ops, and no `torch.distributed` call runs outside it."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.model_parallel_config import ModelParallelConfig
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_fast_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.tensor_parallel import mappings as M
from gigatron.core.tensor_parallel._linear import linear_with_grad_accumulation_and_async_allreduce
from gigatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from gigatron.core.tensor_parallel.wgrad import WGRAD_IN_MAIN_GRAD
from gigatron.core.transformer.fast_path import compile_transformer_layers
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.testing import run_distributed
from tests.core.tensor_parallel.test_mappings import count_collectives

pytestmark = pytest.mark.multirank


TP, S, B, H, V = 2, 8, 2, 32, 64  # ranks, sequence, batch, hidden, vocab
TOL = dict(rtol=1e-6, atol=1e-6)
GPU_TOL = dict(rtol=1e-5, atol=1e-5)  # cuBLAS picks kernels by shape: fp32 sums in other orders


def _rand(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class _Recorder:
    """A dynamo backend that records the op sequence of every graph it compiles (forward and
    the autograd.Function fwd/bwd subgraphs), then hands the graph to `backend`."""

    def __init__(self, backend: str):
        from torch._dynamo.backends.registry import lookup_backend

        self.backend = lookup_backend(backend)
        self.num_graphs = 0
        self.sequences: dict[str, list[str]] = {}  # (sub)graph name -> op names, in order

    def __call__(self, gm, example_inputs):
        self.num_graphs += 1
        for name, mod in gm.named_modules():  # autograd.Function fwd/bwd graphs: submodules
            if isinstance(mod, torch.fx.GraphModule):
                key = f"{self.num_graphs}:{name}"
                self.sequences[key] = [_op_name(n.target) for n in mod.graph.nodes]
        return self.backend(gm, example_inputs)

    @property
    def collectives(self) -> set[str]:
        return {op for seq in self.sequences.values() for op in seq if op.startswith("c10d.")}


def _op_name(target) -> str:
    """ "c10d.all_reduce" for `torch.ops._c10d_functional.all_reduce.default`, else a short name
    ("matmul" for torch.matmul)."""
    name = str(target)
    if name.startswith("_c10d_functional."):
        return "c10d." + name.split(".")[1]
    return getattr(target, "__name__", name)


def _fwd_bwd(fn, params, inputs, grad_seed, grad_scale=1.0):
    """Run `out = fn(*inputs)`, backward a fixed random grad; return (out, input grads, param
    grads) and clear the grads."""
    out = fn(*inputs)
    out.backward(_rand(grad_seed, *out.shape).to(out.device) * grad_scale)
    grads = [x.grad.clone() for x in inputs if x.requires_grad]
    pgrads = {n: p.grad.clone() for n, p in params}
    for x in inputs:
        x.grad = None
    for _, p in params:
        p.grad = None
    return out.detach(), grads, pgrads


def _compare(eager, compiled, what, tol=TOL):
    """assert_close on output, input grads and param grads; returns the largest
    |compiled - eager| / (1 + |eager|) (<= 1e-6 exactly when the assert_close calls pass)."""
    pairs = [(compiled[0], eager[0], "output")]
    pairs += [(a, b, "input grad") for a, b in zip(compiled[1], eager[1], strict=True)]
    assert compiled[2].keys() == eager[2].keys()
    pairs += [(compiled[2][n], g, f"grad of {n}") for n, g in eager[2].items()]
    for a, b, name in pairs:
        torch.testing.assert_close(a, b, **tol, msg=f"{what}: {name}")
    return max(((a - b).abs() / (1 + b.abs())).max().item() for a, b, _ in pairs)


def _eager_vs_compiled(fn, params, inputs, backend, what):
    """fn eager, then compiled with fullgraph=True: same numbers. Returns (max error, the
    recorder holding the compiled graph's collectives)."""
    with count_collectives() as eager_counts:
        eager = _fwd_bwd(fn, params, inputs, grad_seed=99)
    assert sum(eager_counts.values()) > 0, what
    recorder = _Recorder(backend)
    # fullgraph=True: one graph for all of fn, its autograd.Function backwards included, or an
    # error (so no collective can run outside the graph).
    compiled_fn = torch.compile(fn, fullgraph=True, backend=recorder)
    compiled = _fwd_bwd(compiled_fn, params, inputs, grad_seed=99)
    assert recorder.num_graphs == 1, (what, recorder.num_graphs)
    return _compare(eager, compiled, what), recorder


def _gpt_config(sp, num_layers):
    return TransformerConfig(
        num_layers=num_layers,
        hidden_size=H,
        num_attention_heads=4,
        ffn_hidden_size=64,
        activation_func=F.gelu,
        tensor_model_parallel_size=TP,
        sequence_parallel=sp,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
    )


def _layer_case(sp, backend):
    rank = parallel_state.get_tensor_model_parallel_rank()
    model = GPTModel(_gpt_config(sp, 1), get_gpt_layer_fast_spec(), V, S)
    layer = model.decoder.layers[0]
    # SP: each rank holds its own sequence slice; TP only: every rank holds the same input.
    x = (_rand(10 + rank, S // TP, B, H) if sp else _rand(10, S, B, H)).requires_grad_()
    causal = torch.ones(1, 1, S, S, dtype=torch.bool).triu(1)
    err, rec = _eager_vs_compiled(
        lambda h: layer(h, causal)[0], list(layer.named_parameters()), [x], backend, f"sp={sp}"
    )
    expected = {"c10d.all_gather_into_tensor", "c10d.reduce_scatter_tensor"}
    expected = expected if sp else {"c10d.all_reduce"}
    assert expected <= rec.collectives, (sp, rec.collectives)
    return err


def _model_case(sp, backend, device="cpu"):
    model = GPTModel(
        _gpt_config(sp, 2), get_gpt_layer_fast_spec(), V, S, position_embedding_type="rope"
    ).to(device)
    g = torch.Generator().manual_seed(3)
    ids, labels = (torch.randint(0, V, (B, S), generator=g).to(device) for _ in range(2))

    def loss(ids, labels):
        return model(ids, None, None, labels=labels)  # [b, s]

    params = list(model.named_parameters())
    if backend != "fast-path":  # the whole forward and loss in one graph
        return _eager_vs_compiled(loss, params, [ids, labels], backend, "gpt")[0]
    # The fast path as bench_gpt.py runs it: each TransformerLayer compiled (Inductor,
    # fullgraph). Per-token loss weights of a mean (1/(b*s)) keep grads O(1): Inductor sums in
    # another order, an fp32 rounding difference that grows with the values.
    eager = _fwd_bwd(loss, params, [ids, labels], 99, grad_scale=1 / (B * S))
    assert compile_transformer_layers(model, fullgraph=True) == 2
    compiled = _fwd_bwd(loss, params, [ids, labels], 99, grad_scale=1 / (B * S))
    return _compare(eager, compiled, "fast path", TOL if device == "cpu" else GPU_TOL)


def _mappings_chain(x, group):
    """Every mapping once, in an order whose shapes line up: [s/tp, b, h] -> scalar-ish tensor."""
    y = M.gather_from_sequence_parallel_region(x, group=group)  # [s, b, h]
    y = M.copy_to_tensor_model_parallel_region(y, group=group)
    y = M.scatter_to_tensor_model_parallel_region(y * 1.5, group=group)  # [s, b, h/tp]
    y = M.gather_from_tensor_model_parallel_region(y.sin(), group=group)  # [s, b, h]
    y = M.all_gather_last_dim_from_tensor_parallel_region(y[..., : H // TP], group=group)
    y = M.reduce_scatter_last_dim_to_tensor_parallel_region(y.cos(), group=group)  # [s, b, h/tp]
    y = M.reduce_from_tensor_model_parallel_region(y, group=group)
    wait = M.all_to_all_async(group, y * 0.5)  # [s, b, h/tp]: chunks of s exchanged
    z = y.sigmoid()  # issued while the exchange is in flight
    y = wait() + z
    y = M.all_to_all_hp2sp(M.all_to_all_sp2hp(y, group=group), group=group)
    y = M.reduce_scatter_to_sequence_parallel_region(y.reshape(S, B, -1), group=group)
    z = M.gather_from_sequence_parallel_region(
        y, tensor_parallel_output_grad=False, group=group, output_split_sizes=[S // TP] * TP
    )
    return M.scatter_to_sequence_parallel_region(z.tanh(), group=group)  # [s/tp, b, h/tp]


def _mappings_case(backend):
    rank = parallel_state.get_tensor_model_parallel_rank()
    group = parallel_state.get_tensor_model_parallel_group()
    x = _rand(20 + rank, S // TP, B, H).requires_grad_()
    err, rec = _eager_vs_compiled(lambda t: _mappings_chain(t, group), [], [x], backend, "maps")
    assert rec.collectives == {
        "c10d.all_gather_into_tensor",
        "c10d.reduce_scatter_tensor",
        "c10d.all_reduce",
        "c10d.all_to_all_single",
        "c10d.wait_tensor",
    }
    return err


def _fusion_case(backend):
    """gradient_accumulation_fusion: a weight with `main_grad` gets dW added there (eager and
    compiled alike, also with DDP's `grad_added_to_main_grad` flag, since the layers mark their
    own weights); an unmarked weight with DDP's flag gets a plain `.grad` under compile (DDP's
    hook adds it to main_grad) with the same values."""
    rank = parallel_state.get_tensor_model_parallel_rank()
    cfg = ModelParallelConfig(
        tensor_model_parallel_size=TP,
        sequence_parallel=True,
        gradient_accumulation_fusion=True,
        use_cpu_initialization=True,
    )
    col = ColumnParallelLinear(H, 2 * H, config=cfg, init_method=torch.nn.init.normal_, bias=True)
    row = RowParallelLinear(
        2 * H, H, config=cfg, init_method=torch.nn.init.normal_, bias=True,
        input_is_parallel=True, skip_bias_add=False,
    )  # fmt: skip
    weights = [col.weight, row.weight]
    x = _rand(30 + rank, S // TP, B, H).requires_grad_()

    def fn(t):
        return row(F.gelu(col(t)[0]))[0]

    def run(f, ddp_flag):
        for w in weights:
            w.main_grad = torch.zeros_like(w)
            if ddp_flag:
                w.grad_added_to_main_grad = False
            elif hasattr(w, "grad_added_to_main_grad"):
                del w.grad_added_to_main_grad
        out = f(x)
        out.backward(_rand(31, *out.shape))
        dx, x.grad = x.grad, None
        res = [out.detach(), dx, [w.main_grad.clone() for w in weights]]
        res.append([None if w.grad is None else w.grad.clone() for w in weights])
        for p in (*col.parameters(), *row.parameters()):
            p.grad = None
        return res

    compiled_fn = torch.compile(fn, fullgraph=True, backend=backend)
    eager, compiled = run(fn, False), run(compiled_fn, False)
    for a, b in zip(compiled[:2] + compiled[2], eager[:2] + eager[2], strict=True):
        torch.testing.assert_close(a, b, **TOL)
    # Under DDP (its flag present) the compiled backward still adds into main_grad: the layers
    # marked their weights at construction; an unmarked weight gets a plain .grad instead.
    with_flag = run(compiled_fn, True)
    torch.testing.assert_close(with_flag[0], eager[0], **TOL)
    for main_grad, expected in zip(with_flag[2], eager[2], strict=True):
        torch.testing.assert_close(main_grad, expected, **TOL)
    for w in weights:
        delattr(w, WGRAD_IN_MAIN_GRAD)
    unmarked = run(compiled_fn, True)
    for main_grad, grad, expected in zip(unmarked[2], unmarked[3], eager[2], strict=True):
        assert main_grad.abs().max().item() == 0.0  # left to DDP's hook
        torch.testing.assert_close(grad, expected, **TOL)


def _overlap_case(backend, device="cpu"):
    """tp_comm_overlap: the SP all-gather overlapped with this rank's rows' matmul gives the
    plain path's numbers and collectives, eager and compiled; in the compiled forward a matmul
    sits between the all-gather and its wait."""
    rank = parallel_state.get_tensor_model_parallel_rank()
    weight = (_rand(40 + rank, 24, H) * 0.3).to(device).requires_grad_()  # [o/tp, h]
    bias = _rand(42 + rank, 24).to(device).requires_grad_()
    x = _rand(44 + rank, S // TP, B, H).to(device).requires_grad_()  # [s/tp, b, h]
    params = [("weight", weight), ("bias", bias)]

    def linear(overlap):
        return lambda t: linear_with_grad_accumulation_and_async_allreduce(
            t, weight, bias, False, False, True, tp_comm_overlap=overlap
        )  # [s, b, o/tp]

    with count_collectives() as plain_counts:
        plain = _fwd_bwd(linear(False), params, [x], grad_seed=98)
    with count_collectives() as overlap_counts:
        overlapped = _fwd_bwd(linear(True), params, [x], grad_seed=98)
    assert plain_counts == overlap_counts, (plain_counts, overlap_counts)
    tol = TOL if device == "cpu" else GPU_TOL
    err = _compare(plain, overlapped, "tp_comm_overlap eager", tol)
    rec = _Recorder(backend)
    compiled_fn = torch.compile(linear(True), fullgraph=True, backend=rec)
    err = max(err, _compare(plain, _fwd_bwd(compiled_fn, params, [x], 98), "compiled", tol))
    fwd = next(q for k, q in rec.sequences.items() if "fwd" in k)
    start = fwd.index("c10d.all_gather_into_tensor")
    assert "matmul" in fwd[start : fwd.index("c10d.wait_tensor", start)], fwd
    return err


def _body(backend, cases):
    torch.set_num_threads(1)
    parallel_state.initialize_model_parallel(TP)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    errors, times = {}, {}
    for case in cases:
        torch._dynamo.reset()
        start = time.perf_counter()
        if case.startswith("layer"):
            errors[case] = _layer_case(case.endswith("sp"), backend)
        elif case.startswith("gpt"):
            errors[case] = _model_case(case.endswith("sp"), backend)
        elif case == "mappings":
            errors[case] = _mappings_case(backend)
        elif case == "overlap":
            errors[case] = _overlap_case(backend)
        elif case == "fusion":
            _fusion_case(backend)
        times[case] = round(time.perf_counter() - start, 2)
    return errors, times


def test_tp_compile_fullgraph_aot_eager_matches_eager():
    cases = ["layer", "layer-sp", "gpt", "gpt-sp", "mappings", "fusion", "overlap"]
    errors, times = run_distributed(_body, TP, args=("aot_eager", cases), timeout=240)[0]
    print(f"max |c - e| / (1 + |e|): {errors}, seconds: {times}")
    assert max(errors.values()) <= 1e-6, errors


def _cxx_compiler_works() -> bool:
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return bool(get_cpp_compiler())
    except Exception:
        return False


@pytest.mark.skipif(not _cxx_compiler_works(), reason="Inductor on CPU needs a C++ compiler")
def test_tp_compile_transformer_layers_inductor_matches_eager():
    """compile_transformer_layers (Inductor, fullgraph) on a TP = 2 + SP GPTModel."""
    errors, times = run_distributed(_body, TP, args=("fast-path", ["gpt-sp"]), timeout=240)[0]
    print(f"max |c - e| / (1 + |e|): {errors}, seconds: {times}")
    assert max(errors.values()) <= 1e-6, errors


def _gpu_body(async_tp):
    """NCCL, fp32 without TF32: the fast path (and tp_comm_overlap) compiled by Inductor for
    CUDA equals eager. `async_tp`: Inductor's micro-pipeline TP (symmetric memory) too."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    parallel_state.initialize_model_parallel(TP)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    device = torch.device("cuda", torch.cuda.current_device())
    if async_tp:
        import torch._inductor.config as inductor_config
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        inductor_config._micro_pipeline_tp = True
        enable_symm_mem_for_group(parallel_state.get_tensor_model_parallel_group().group_name)
        return {"fast-path async TP": _model_case(True, "fast-path", device)}
    return {
        "fast-path": _model_case(True, "fast-path", device),
        "overlap": _overlap_case("inductor", device),
    }


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
@pytest.mark.parametrize("async_tp", [False, True])
def test_tp_compile_nccl_matches_eager(async_tp):
    errors = run_distributed(_gpu_body, TP, args=(async_tp,), backend="nccl", timeout=300)[0]
    print(f"max |c - e| / (1 + |e|): {errors}")
    assert max(errors.values()) <= 1e-5, errors
