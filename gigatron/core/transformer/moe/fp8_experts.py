"""GroupedMLP's expert GEMMs in FP8: each local expert's fc1 and fc2 through the FP8 linear of
`tensor_parallel/fp8_linear.py`, on views of the grouped weights.

Expert `e` multiplies its rows of the permuted tokens by `weight1[e] [h, glu*f/etp]` and
`weight2[e] [f/etp, h]`; as linears these are `weight1[e]^T` (column-parallel over expert TP)
and `weight2[e]^T` (row-parallel), cast and scaled exactly as SequentialMLP's FP8 experts are
(one scale per expert weight and per expert's activation under the per-tensor recipe, amaxes
over a split dimension all-reduced in the expert-TP group), so the two layouts give the same
numbers. Expert communication is the dispatcher's: no TP collective here besides the amaxes.

The experts run one after the other (the token counts come to the host, as GroupedMLP's loop
fallback); `torch._scaled_grouped_mm` takes row-wise e4m3 operands only, so the per-tensor and
hybrid recipes cannot use it as one grouped FP8 GEMM.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gigatron.core.tensor_parallel.fp8_linear import Fp8LinearFunction, delayed_args
from gigatron.core.transformer.mlp import glu_activation


def fp8_grouped_mlp(
    module, x: Tensor, w1: Tensor, w2: Tensor, tokens_per_expert: Tensor, probs: Tensor
) -> Tensor:
    """`x [N, h]` grouped by expert, `w1 [n, h, glu*f/etp]`, `w2 [n, f/etp, h]`, counts `[n]`,
    `probs [N]` -> `[N, h]` (partial over expert TP, as GroupedMLP's bf16 output)."""
    cfg, recipe, group = module.config, module.fp8_recipe, module.tp_group
    counts = tokens_per_expert.tolist()
    # delayed scaling: each expert GEMM has its own amax history (fc1, fc2 of expert e)
    states = getattr(module, "fp8_states", None) or [None] * (2 * len(counts))
    outputs = []
    for e, (x_e, p_e) in enumerate(zip(torch.split(x, counts), torch.split(probs, counts))):
        fc1 = Fp8LinearFunction.apply(
            x_e, w1[e].t(), None, recipe, "column", False, False, False, group,
            delayed_args(states[2 * e]),
        )  # fmt: skip  # [n_e, glu*f/etp]
        if cfg.gated_linear_unit:
            act = glu_activation(fc1, cfg, module.activation_func)
        else:
            act = module.activation_func(fc1)
        act = (act * p_e.unsqueeze(-1)).to(x.dtype)
        outputs.append(
            Fp8LinearFunction.apply(
                act,
                w2[e].t(),
                None,
                recipe,
                "row",
                False,
                False,
                False,
                group,
                delayed_args(states[2 * e + 1]),
            )
        )  # [n_e, h]
    return torch.cat(outputs, dim=0)
