"""Weight gradient of the parallel linears, with Megatron's `gradient_accumulation_fusion`.

Megatron adds dW straight into the fp32/bf16 `param.main_grad` of its DDP buffer with an apex
GEMM (`fused_weight_gradient_mlp_cuda`), so no transient `.grad` is allocated and DDP's hook
has nothing to copy. gigatron does the same with a cuBLAS `addmm_` (beta = 1) wrapped in a
custom op: under torch.compile the op mutates `main_grad` in place (a plain `addmm_` on a graph
input would be functionalized into `addmm` + a copy back, the very pass this saves). An fp32
`main_grad` with bf16/fp16 activations (`--accumulate-allreduce-grads-in-fp32`) takes aten's
`addmm.dtype_out` on CUDA: one GEMM accumulating into fp32, like apex's
`wgrad_gemm_accum_fp32`; elsewhere a bf16 GEMM and one fp32 add.

DDP's hook learns that dW is already in `main_grad` from `param.grad_added_to_main_grad`,
which the backward sets (Megatron's contract). A compiled backward cannot set attributes, so
the parallel linears mark their own weight once at construction (`WGRAD_IN_MAIN_GRAD`) and
gigatron's DDP hook reads that too; weights without the mark (e.g. a tied embedding passed to
the output layer) get a plain `.grad` under compile, which DDP's hook adds.

The fp32-accumulating GEMM is the default; `ModelParallelConfig.wgrad_gemm_accum_fp32=False`
(`--no-wgrad-gemm-accum-fp32`) selects the bf16 GEMM + fp32 add, for A/B measurements. The
layers copy that field onto their weight (`WGRAD_GEMM_ACCUM_FP32`) with the mark above; a weight
they did not mark takes the default.
"""

from __future__ import annotations

import torch

# Attribute the parallel linears set on their own weight when gradient_accumulation_fusion is
# on: "while this weight has a main_grad, my backward adds dW into it" (gigatron only).
WGRAD_IN_MAIN_GRAD = "wgrad_added_to_main_grad_by_layer"
# ModelParallelConfig.wgrad_gemm_accum_fp32 of the layer that marked the weight (gigatron only).
WGRAD_GEMM_ACCUM_FP32 = "wgrad_gemm_accum_fp32"


@torch.library.custom_op("gigatron::wgrad_accumulate_", mutates_args=("main_grad",))
def wgrad_accumulate_(
    main_grad: torch.Tensor,
    grad_output_2d: torch.Tensor,
    input_2d: torch.Tensor,
    fp32_gemm: bool = True,
) -> None:
    """`main_grad [o, h] += grad_output_2d [n, o]^T @ input_2d [n, h]`, in place. `fp32_gemm`:
    may a lower-precision product accumulate into an fp32 `main_grad` inside the GEMM."""
    if main_grad.dtype == grad_output_2d.dtype:
        main_grad.addmm_(grad_output_2d.t(), input_2d)
    elif not (fp32_gemm and _addmm_fp32_accumulate(main_grad, grad_output_2d.t(), input_2d)):
        # e.g. fp32 main_grad, bf16 activations on CPU: bf16 GEMM, then one fp32 add
        main_grad.add_(grad_output_2d.t().matmul(input_2d).to(main_grad.dtype))


# None: not tried yet; False: this build refused it (then the bf16 GEMM + fp32 add path)
_ADDMM_FP32 = {"ok": None}


def _addmm_fp32_accumulate(main_grad, a, b) -> bool:
    """`main_grad [o, h] (fp32) += a [o, n] @ b [n, h]` (bf16/fp16) as one cuBLAS GEMM that
    accumulates into the fp32 buffer (aten's `addmm.dtype_out`, CUDA only), as Megatron's apex
    `wgrad_gemm_accum_fp32`: dW is never rounded to bf16 or written apart, and no extra fp32
    pass runs. False when not applicable or not supported by this build."""
    if (
        _ADDMM_FP32["ok"] is False
        or not main_grad.is_cuda
        or main_grad.dtype != torch.float32
        or a.dtype not in (torch.bfloat16, torch.float16)
        or not hasattr(torch.ops.aten.addmm, "dtype_out")
    ):
        return False
    try:
        torch.ops.aten.addmm.dtype_out(main_grad, a, b, torch.float32, out=main_grad)
    except torch.OutOfMemoryError:
        raise  # not a missing kernel: never a reason to give the GEMM up
    except (RuntimeError, NotImplementedError):
        if _ADDMM_FP32["ok"]:
            raise  # it worked before: a real error
        _ADDMM_FP32["ok"] = False
        return False
    _ADDMM_FP32["ok"] = True
    return True


@wgrad_accumulate_.register_fake
def _(main_grad, grad_output_2d, input_2d, fp32_gemm=True) -> None:
    return None


def weight_grad(ctx, weight, grad_output_2d, total_input_2d):
    """dW = dY^T X `[o, h]`; with gradient_accumulation_fusion and `weight.main_grad`, added
    there instead, returning what autograd should see as the weight's grad (None without DDP's
    flag; otherwise a placeholder of the right shape, Megatron's convention)."""
    fuse = ctx.gradient_accumulation_fusion and hasattr(weight, "main_grad")
    tracked = hasattr(weight, "grad_added_to_main_grad")  # DDP's per-step flag
    compiling = torch.compiler.is_compiling()
    if fuse and compiling and tracked and not getattr(weight, WGRAD_IN_MAIN_GRAD, False):
        fuse = False  # cannot tell DDP's hook from a compiled backward: a plain .grad
    if not fuse:
        return grad_output_2d.t().matmul(total_input_2d)
    fp32_gemm = getattr(weight, WGRAD_GEMM_ACCUM_FP32, True)
    wgrad_accumulate_(weight.main_grad, grad_output_2d, total_input_2d, fp32_gemm)
    if not tracked:
        return None
    if not compiling:
        weight.grad_added_to_main_grad = True
    if getattr(weight, "zero_out_wgrad", False):
        return torch.zeros(weight.main_grad.shape, dtype=weight.dtype, device=weight.device)
    return torch.empty(weight.main_grad.shape, dtype=weight.dtype, device=weight.device)


def hand_over_weight_grad(weight, grad_weight):
    """For code other than the parallel linears that computes a layer weight's whole dW (e.g.
    the chunked output layer + cross entropy): a weight the layers marked `WGRAD_IN_MAIN_GRAD`
    gets dW added to its `main_grad` here, because DDP's hook will skip its `.grad`. Returns
    what autograd should see as the weight's grad (`grad_weight` itself when unmarked)."""
    if not (getattr(weight, WGRAD_IN_MAIN_GRAD, False) and hasattr(weight, "main_grad")):
        return grad_weight
    main_grad = weight.main_grad
    main_grad.add_(grad_weight.to(main_grad.dtype))
    if getattr(weight, "zero_out_wgrad", False):
        return torch.zeros(main_grad.shape, dtype=weight.dtype, device=weight.device)
    return torch.empty(main_grad.shape, dtype=weight.dtype, device=weight.device)
