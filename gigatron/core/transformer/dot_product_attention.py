"""Core attention on plain PyTorch ops: the reference every fast path is tested against.

Mirrors `megatron.core.transformer.dot_product_attention.DotProductAttention` (the local, non-TE
path): GQA by repeating K/V heads, scores = softmax_scale * q.k^T, Megatron's scale-mask-softmax
(bool mask, True = masked, filled with -10000; causal mask built when none is given; fp32 softmax
for half inputs), dropout on the probabilities in the TP RNG fork, context = probs.v.
Gemma's additions: `attn_logit_softcapping` caps the scaled scores (cap * tanh(x / cap)) before the
mask; a sliding-window layer (`config.window_size` on the layers `is_layer_window_attention`
picks) also masks keys outside the window of each query, OR-ed into the causal / given mask
(`utils.get_sliding_window_causal_mask`; Megatron's local path replaces the mask). GPT-OSS's
attention sinks: `config.softmax_type` 'off-by-one' / 'learnable' adds one sink logit per head to
the softmax denominator (`softmax_offset`, [np], zeros or a TP-sharded parameter).

Shapes: s: seq, b: micro-batch, np: query heads on this rank, ng: query groups on this rank,
hn: head dim (kv_channels).
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import Tensor

from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.packed_seq_params import (  # PackedSeqParams: Megatron's name here
    PackedSeqParams,  # noqa: F401
    layout_bounds,
    thd_attention_mask,
    thd_document_positions,
)
from gigatron.core.transformer.enums import AttnMaskType
from gigatron.core.transformer.module import MegatronModule
from gigatron.core.transformer.utils import (
    attention_mask_func,
    get_default_causal_mask,
    get_sliding_window_causal_mask,
    is_layer_window_attention,
    logit_softcapping,
)
from gigatron.core.utils import divide

# Mask types that keep a packed document causal (sq == sk there: bottom-right is the diagonal).
CAUSAL_MASK_TYPES = (
    AttnMaskType.causal,
    AttnMaskType.padding_causal,
    AttnMaskType.causal_bottom_right,
)


class DotProductAttention(MegatronModule):
    """Scaled dot-product attention over heads already split across TP ranks."""

    def __init__(
        self,
        config,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str = "self",
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection=None,
    ):
        super().__init__(config)
        if config.context_parallel_size != 1:
            raise ValueError(
                f"context_parallel_size ({config.context_parallel_size}) > 1 is not supported by "
                "gigatron's DotProductAttention; Attention swaps it for "
                "gigatron.core.transformer.context_parallel.ContextParallelAttention"
            )
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        tp_size = parallel_state.get_tensor_model_parallel_world_size()
        self.hidden_size_per_partition = divide(
            config.kv_channels * config.num_attention_heads, tp_size
        )
        self.num_attention_heads_per_partition = divide(config.num_attention_heads, tp_size)
        self.num_query_groups_per_partition = divide(config.num_query_groups, tp_size)
        coeff = None
        if softmax_scale is None:
            softmax_scale = config.softmax_scale
        if softmax_scale is None:
            softmax_scale = 1.0 / math.sqrt(config.kv_channels)
        if config.apply_query_key_layer_scaling:
            # Scores are divided by layer_number before the softmax and multiplied back inside it
            # (in fp32), which keeps fp16 scores from overflowing in deep models.
            coeff = self.layer_number
            softmax_scale /= coeff
        self.softmax_scale, self.softmax_coeff = softmax_scale, coeff
        self.softcap = config.attn_logit_softcapping
        self.attention_dropout_p = (
            config.attention_dropout if attention_dropout is None else attention_dropout
        )
        self.attention_dropout = torch.nn.Dropout(self.attention_dropout_p)
        self.window_size = layer_window_size(config, self.layer_number)  # (left, right) | None
        add_softmax_offset(self, config, self.num_attention_heads_per_partition)

    def _dropout_rng(self):
        """Dropout inside a TP region uses the model-parallel RNG (different per TP rank).

        Traced by torch.compile with TP = 1: no fork (dynamo cannot trace the RNG state swap,
        and a compiled graph draws its dropout masks from Inductor's own generator seeded from
        the default one: a different stream than eager either way; with one TP rank no other
        rank's masks need to differ). With TP > 1 the fork stays and breaks the graph there."""
        if self.config.sequence_parallel or not (self.training and self.attention_dropout_p > 0):
            return contextlib.nullcontext()
        if self.config.tensor_model_parallel_size == 1 and torch.compiler.is_compiling():
            return contextlib.nullcontext()

        return tensor_parallel.get_cuda_rng_tracker().fork()

    def _packed_mask(self, query, packed_seq_params, attention_mask, mask_type) -> Tensor:
        """bool [1, 1, s, s] (True = masked) keeping every query inside its own document
        (causal there for causal mask types), OR-ed with `attention_mask` when one is given."""
        doc, pos = thd_document_positions(
            layout_bounds(packed_seq_params), query.shape[0], device=query.device
        )
        causal = mask_type in CAUSAL_MASK_TYPES
        mask = thd_attention_mask(doc, pos, doc, pos, causal)
        return mask if attention_mask is None else mask | attention_mask

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: Tensor | None = None,
        packed_seq_params=None,
    ) -> Tensor:
        """q [sq, b, np, hn], k/v [sk, b, ng, hn], mask bool [b|1, 1, sq, sk] -> [sq, b, np*hn].
        attention_bias [1|b, np, sq, sk] (T5's relative positions) is added to the scaled
        scores before masking (Transformer Engine's post_scale_bias; Megatron's local path has
        none). packed_seq_params (thd, b = 1): queries see only their own document's keys."""
        mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        if packed_seq_params is not None:
            attention_mask = self._packed_mask(query, packed_seq_params, attention_mask, mask_type)
        sq, b, np_, hn = query.shape
        sk = key.shape[0]
        if np_ != key.shape[2]:  # GQA: each K/V head serves np/ng consecutive query heads
            key = key.repeat_interleave(np_ // key.shape[2], dim=2)  # [sk, b, np, hn]
            value = value.repeat_interleave(np_ // value.shape[2], dim=2)
        q = query.permute(1, 2, 0, 3).reshape(b * np_, sq, hn)  # [b*np, sq, hn]
        k = key.permute(1, 2, 3, 0).reshape(b * np_, hn, sk)  # [b*np, hn, sk]
        scores = torch.bmm(q, k).mul_(self.softmax_scale).view(b, np_, sq, sk)  # [b, np, sq, sk]
        if attention_bias is not None:
            scores = scores + attention_bias
        scores = logit_softcapping(scores, self.softcap)
        probs = self._scale_mask_softmax(scores, attention_mask, mask_type)
        with self._dropout_rng():
            probs = self.attention_dropout(probs)
        v = value.permute(1, 2, 0, 3).reshape(b * np_, sk, hn)  # [b*np, sk, hn]
        context = torch.bmm(probs.view(b * np_, sq, sk), v)  # [b*np, sq, hn]
        context = context.view(b, np_, sq, hn).permute(2, 0, 1, 3)  # [sq, b, np, hn]
        return context.reshape(sq, b, np_ * hn)  # [sq, b, np*hn]

    def _scale_mask_softmax(self, scores: Tensor, mask: Tensor | None, mask_type) -> Tensor:
        """Megatron's FusedScaleMaskSoftmax, torch path. scores [b, np, sq, sk]."""
        in_half = scores.dtype in (torch.float16, torch.bfloat16)
        upcast = in_half and self.config.attention_softmax_in_fp32
        x = scores.float() if upcast else scores
        if self.softmax_coeff is not None:
            x = x * self.softmax_coeff
        if mask is None and mask_type == AttnMaskType.causal and x.shape[2] > 1:
            mask = get_default_causal_mask(x.shape[2], x.shape[3], device=x.device)
        if self.window_size is not None:
            # queries aligned bottom-right (a KV cache); in a packed (thd) row the distances are
            # the in-document ones, and the document mask keeps other documents out
            window = get_sliding_window_causal_mask(*x.shape[2:], self.window_size, x.device)
            mask = window if mask is None else mask | window  # [sq, sk] or [b|1, 1, sq, sk]
        if mask is not None:
            x = attention_mask_func(x, mask)
        if self.softmax_offset is None:
            probs = torch.softmax(x, dim=-1)
        else:
            probs = softmax_with_sink(x, self.softmax_offset)
        return probs.to(scores.dtype) if upcast else probs

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """The learnable `softmax_offset` split over TP along heads (Megatron's key
        `...core_attention.softmax_offset`); nothing else."""
        return softmax_offset_sharded_state_dict(self, prefix, sharded_offsets, metadata)


def layer_window_size(config, layer_number: int) -> tuple[int, int] | None:
    """config.window_size on the layers `is_layer_window_attention` picks, else None."""
    if is_layer_window_attention(config.window_size, config.window_attn_skip_freq, layer_number):
        return tuple(config.window_size)
    return None


def add_softmax_offset(module, config, num_heads_per_rank: int, head_offset: int = 0) -> None:
    """`module.softmax_offset`: None ('vanilla'), zeros [np] ('off-by-one', a non-persistent
    buffer) or a Parameter [np] ('learnable'), this TP rank's heads of the [num_attention_heads]
    sink logits, drawn in full with `config.init_method` and sliced (any TP gives the same
    sinks; Megatron draws each rank's slice on the TP RNG stream)."""
    kind = config.softmax_type
    if kind == "vanilla":
        module.softmax_offset = None
        return
    dtype = config.params_dtype
    if kind == "off-by-one":
        module.register_buffer(
            "softmax_offset", torch.zeros(num_heads_per_rank, dtype=dtype), persistent=False
        )
        return
    full = torch.zeros(config.num_attention_heads, dtype=torch.float32)
    if config.perform_initialization:
        config.init_method(full)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    first = tp_rank * num_heads_per_rank + head_offset
    param = torch.nn.Parameter(full[first : first + num_heads_per_rank].to(dtype).clone())
    param.tensor_model_parallel, param.partition_dim, param.partition_stride = True, 0, 1
    module.softmax_offset = param


def softmax_with_sink(scores: Tensor, softmax_offset: Tensor) -> Tensor:
    """softmax over [b, np, sq, sk] scores with one more logit per head (softmax_offset [np])
    in each row's denominator; the sink's own probability is dropped."""
    b, np_, sq, _ = scores.shape
    sink = softmax_offset.to(scores.dtype).reshape(1, np_, 1, 1).expand(b, np_, sq, 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]


def softmax_offset_sharded_state_dict(module, prefix, sharded_offsets, metadata) -> dict:
    from gigatron.core.utils import make_sharded_tensors_for_checkpoint

    if not isinstance(module.softmax_offset, torch.nn.Parameter):
        return {}
    return make_sharded_tensors_for_checkpoint(
        {"softmax_offset": module.softmax_offset}, prefix, {"softmax_offset": 0}, sharded_offsets,
        dp_cp_group=(metadata or {}).get("dp_cp_group"),
    )  # fmt: skip
