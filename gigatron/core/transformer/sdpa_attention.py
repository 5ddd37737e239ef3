"""Fast core attention on `torch.nn.functional.scaled_dot_product_attention`.

The one adapter between gigatron's attention and PyTorch's fused kernels (flash / cuDNN /
memory-efficient on GPU, a fused CPU kernel otherwise). Same constructor, inputs and numbers as
`DotProductAttention` (tested against it): causal masks use `is_causal`, explicit bool masks
(True = masked) become an additive -10000 bias, GQA uses `enable_gqa` instead of repeating K/V.
Dropout draws from SDPA's own RNG stream, so with attention dropout on the two paths agree in
distribution, not bit for bit. Packed sequences (`packed_seq_params`, thd): on CUDA in fp16/bf16
without attention dropout, PyTorch's FlashAttention varlen kernel
(`torch.nn.attention.varlen.varlen_attn`, no [s, s] mask); otherwise the block-diagonal document
mask through SDPA, as the plain path does. Sliding windows become part of the bool mask (no
`is_causal`; packed sequences with a window take that mask path, not varlen). Attention logit
soft-capping (a function of the scores) and attention sinks (`softmax_type` other than
'vanilla') have no SDPA kernel and take the plain path. Used by `get_gpt_layer_fast_spec`;
gigatron-specific
(Megatron's counterpart is Transformer Engine's TEDotProductAttention).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.varlen import varlen_attn

from gigatron.core.packed_seq_params import layout_bounds
from gigatron.core.transformer.dot_product_attention import CAUSAL_MASK_TYPES, DotProductAttention
from gigatron.core.transformer.enums import AttnMaskType
from gigatron.core.transformer.utils import get_sliding_window_causal_mask


class SDPADotProductAttention(DotProductAttention):
    """DotProductAttention computed by one `scaled_dot_product_attention` call."""

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
        """q [sq, b, np, hn], k/v [sk, b, ng, hn], mask bool [b|1, 1, sq, sk] -> [sq, b, np*hn]."""
        if attention_bias is not None:
            raise ValueError(
                "attention_bias is not supported by gigatron's SDPADotProductAttention; use "
                "DotProductAttention"
            )
        if self.softcap or self.softmax_offset is not None:  # no SDPA kernel takes them
            return super().forward(
                query, key, value, attention_mask, attn_mask_type,
                packed_seq_params=packed_seq_params,
            )  # fmt: skip
        mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        sq, b, np_, hn = query.shape
        if packed_seq_params is not None:
            if self._use_varlen(query, attention_mask, mask_type):
                return self._varlen(query, key, value, packed_seq_params, mask_type)
            attention_mask = self._packed_mask(query, packed_seq_params, attention_mask, mask_type)
        sk = key.shape[0]
        q = query.permute(1, 2, 0, 3)  # [b, np, sq, hn]
        k = key.permute(1, 2, 0, 3)  # [b, ng, sk, hn]
        v = value.permute(1, 2, 0, 3)
        is_causal, bias = False, None
        if attention_mask is None and mask_type == AttnMaskType.causal and sq > 1:
            if sq == sk and self.window_size is None:
                is_causal = True
            else:
                attention_mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(
                    1 + sk - sq
                )
        if self.window_size is not None:
            window = get_sliding_window_causal_mask(sq, sk, self.window_size, q.device)
            attention_mask = window if attention_mask is None else attention_mask | window
        if attention_mask is not None:
            bias = torch.zeros(attention_mask.shape, dtype=q.dtype, device=q.device)
            bias = bias.masked_fill(attention_mask, -10000.0)
        # The undivided scale: apply_query_key_layer_scaling only matters for fp16 overflow,
        # which the fused kernels avoid by accumulating in fp32.
        scale = self.softmax_scale * (self.softmax_coeff or 1)
        dropout_p = self.attention_dropout_p if self.training else 0.0
        with self._dropout_rng():
            context = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=bias,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=scale,
                enable_gqa=k.shape[1] != np_,
            )  # [b, np, sq, hn]
        return context.permute(2, 0, 1, 3).reshape(sq, b, np_ * hn)  # [sq, b, np*hn]

    def _use_varlen(self, query: Tensor, attention_mask, mask_type) -> bool:
        dropout = self.training and self.attention_dropout_p > 0
        return (
            query.is_cuda
            and query.dtype in (torch.float16, torch.bfloat16)
            and attention_mask is None
            and not dropout
            and mask_type != AttnMaskType.arbitrary
            and self.window_size is None
        )

    def _varlen(self, query, key, value, packed_seq_params, mask_type) -> Tensor:
        """q [t, 1, np, hn], k/v [t, 1, ng, hn] -> [t, 1, np*hn], one FlashAttention varlen
        call over all documents (causal inside each for causal masks)."""
        t, _, np_, hn = query.shape
        cu = layout_bounds(packed_seq_params).reshape(-1).to(query.device, torch.int32)
        max_len = packed_seq_params.max_seqlen_q
        if max_len is None or packed_seq_params.cu_seqlens_q_padded is not None:  # a host read
            max_len = int((cu[1:] - cu[:-1]).max())
        causal = mask_type in CAUSAL_MASK_TYPES
        key, value = key[:, 0], value[:, 0]  # [t, ng, hn]
        if key.shape[1] != np_:  # GQA by repeating K/V heads: torch 2.11's varlen has no flag
            key = key.repeat_interleave(np_ // key.shape[1], dim=1)  # [t, np, hn]
            value = value.repeat_interleave(np_ // value.shape[1], dim=1)
        context = varlen_attn(
            query[:, 0], key, value, cu, cu, max_len, max_len,
            scale=self.softmax_scale * (self.softmax_coeff or 1),
            window_size=(-1, 0) if causal else (-1, -1),
        )  # fmt: skip
        return context.reshape(t, 1, np_ * hn)  # [t, 1, np*hn]
