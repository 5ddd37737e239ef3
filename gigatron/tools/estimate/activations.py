"""Bytes autograd keeps for backward, per microbatch: one transformer layer, the embedding and
the output head of one rank. A documented accounting, checked against measurement
(tests/tools/test_estimate.py: live tensor bytes of real CPU training steps).

Megatron's paper (Korthikanti et al. 2022, "Reducing Activation Recomputation") counts
`s·b·h·(34 + 5·a·s/h)` bytes per layer in fp16 with dropout: 5·a·s² of it is the attention scores,
softmax and its dropout mask. gigatron's attention is SDPA (flash / efficient / CPU flash), which
keeps the output and a log-sum-exp instead of the s² matrices, and the per-token sizes differ
(GQA, SwiGLU, RMSNorm). What gigatron keeps, in elements of the activation dtype (e bytes), for
x = s·b/cp tokens of a rank, t = TP, x_sp = x/t under sequence parallelism else x:

    input norm       x_sp·h            (+ x_sp fp32 mean and rstd) LayerNorm; RMSNorm (TorchRMSNorm,
                                       not fused) keeps its fp32 input, rstd and the normalised
                                       input of the gain: x_sp·h·(4 + e) bytes
    QKV input        x_sp·h            the column-parallel linear keeps its input (under SP the
                                       local shard; backward gathers it again, as Megatron)
    QKV output       x·(q + 2·g·d)/t   SDPA keeps q, k, v (one storage)
    log-sum-exp      b·(a/t)·s/cp      fp32
    attention out    x·q/t             also the row-parallel projection's input (same storage)
    pre-MLP norm     x_sp·h            (+ stats)
    fc1 input        x_sp·h
    activation       GELU: 2·x·f/t (its input, fc2's input);  SwiGLU: 5·x·f/t (fc1 out 2f,
                     silu(gate) f, up + glu_linear_offset f, the product f)
    context parallel (cp - 1)·x·(2·g·d + 2·q)/t more: the ring's received K/V blocks and
                     partial outputs (fitted to measurement, see the test)
    dropout masks    2·x_sp·h bytes when --hidden-dropout > 0 (bool)

Pipeline stages other than the last also keep each in-flight microbatch's sent output x_sp·h
(the schedule holds it for backward unless deallocate_pipeline_outputs).
Head (last stage): final norm x_sp·h (+ stats), output-layer input x_sp·h, and the vocab-parallel
cross entropy's softmax x·V/t in fp32 (none with --cross-entropy-loss-fusion, which recomputes
logits chunk by chunk). Its backward's transient (`logits_grad_bytes`): the fp32 logits'
gradient x·V/t·4 on the plain path; chunk-sized buffers with the fusion (three [4096, V/t]
tensors of e bytes, the fp32 dW accumulator and dX: 1.32 GiB for gpt-125m's 16k tokens, not the
3.07 GiB of a whole fp32 gradient).
Full recompute keeps only each checkpointed chunk's input x_sp·h; selective recompute (core
attention) drops only the log-sum-exp: SDPA keeps no s² matrices for it to save, which is where
Megatron's selective recompute wins its memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from gigatron.core.fusions.chunked_cross_entropy import CHUNK_SIZE

_FP32 = 4


@dataclass(frozen=True)
class Shape:
    """The sizes the accounting needs (global sizes; per-rank ones computed here)."""

    seq: int
    micro_batch: int
    hidden: int
    ffn: int
    heads: int
    kv_groups: int
    head_dim: int
    vocab: int  # padded
    tp: int
    cp: int
    sp: bool
    swiglu: bool
    rmsnorm: bool
    dropout: bool
    act_bytes: int
    fused_ce: bool
    selective: bool = False  # --recompute-granularity selective: core attention recomputed

    @classmethod
    def of(cls, config, *, seq_length: int, micro_batch_size: int, padded_vocab_size: int):
        """The sizes of a model built from `config` (its TransformerConfig) for microbatches of
        `micro_batch_size` sequences of `seq_length` tokens over a `padded_vocab_size` vocab."""
        return cls(
            seq=seq_length,
            micro_batch=micro_batch_size,
            hidden=config.hidden_size,
            ffn=config.ffn_hidden_size,
            heads=config.num_attention_heads,
            kv_groups=config.num_query_groups,
            head_dim=config.kv_channels,
            vocab=padded_vocab_size,
            tp=config.tensor_model_parallel_size,
            cp=config.context_parallel_size,
            sp=config.sequence_parallel,
            swiglu=config.gated_linear_unit,
            rmsnorm=config.normalization == "RMSNorm",
            dropout=config.hidden_dropout > 0,
            act_bytes=config.params_dtype.itemsize,
            fused_ce=config.cross_entropy_loss_fusion,
            selective=config.recompute_granularity == "selective",
        )

    @property
    def tokens(self) -> int:
        """x: tokens of a rank's microbatch (its CP chunk of the sequence)."""
        return self.seq * self.micro_batch // self.cp

    @property
    def tokens_sp(self) -> int:
        return self.tokens // self.tp if self.sp else self.tokens


def _norm(sh: Shape) -> int:
    x = sh.tokens_sp * sh.hidden
    if sh.rmsnorm:  # TorchRMSNorm: the fp32 input, rstd, and the normalised input of the gain
        return x * (_FP32 + sh.act_bytes) + sh.tokens_sp * _FP32
    return x * sh.act_bytes + 2 * sh.tokens_sp * _FP32  # F.layer_norm: input, mean, rstd


def moe_mlp_bytes(sh: Shape, *, ffn: int, topk: int, num_experts: int) -> int:
    """An MoE MLP (alltoall / allgather dispatcher, SequentialMLP experts): the router's input,
    top-k indices and probabilities, the permuted tokens (X = x·topk rows, about as many on each
    EP rank when balanced), per expert act input, its probability-scaled output and fc2 input,
    and the unpermute's input."""
    e, x, t = sh.act_bytes, sh.tokens, sh.tp
    routed = x * topk
    per_row = (6 if sh.swiglu else 3) * ffn // t * e
    return (
        x * sh.hidden * e + 2 * routed * sh.hidden * e + routed * (per_row + 16) + num_experts * x
    )


def layer_bytes(sh: Shape, *, moe: tuple[int, int, int] | None = None) -> int:
    """Bytes one transformer layer keeps for backward (the module table); `moe`: (expert ffn,
    top-k, number of experts) of an MoE layer."""
    e, x, t = sh.act_bytes, sh.tokens, sh.tp
    q = sh.heads * sh.head_dim
    f = sh.ffn
    attn = sh.tokens_sp * sh.hidden * e + x * (q + 2 * sh.kv_groups * sh.head_dim) // t * e
    if not sh.selective:  # checkpointed core attention keeps its inputs (q, k, v) only
        attn += sh.micro_batch * (sh.heads // t) * (sh.seq // sh.cp) * _FP32
    attn += x * q // t * e
    mlp = sh.tokens_sp * sh.hidden * e + (5 if sh.swiglu else 2) * x * f // t * e
    if sh.cp > 1:  # ring attention: each step's received K/V and partial output (measured)
        attn += (sh.cp - 1) * x * (2 * sh.kv_groups * sh.head_dim + 2 * q) // t * e
    if moe is not None:
        mlp = moe_mlp_bytes(sh, ffn=moe[0], topk=moe[1], num_experts=moe[2])
    masks = 2 * sh.tokens_sp * sh.hidden if sh.dropout else 0
    return 2 * _norm(sh) + attn + mlp + masks


def recompute_input_bytes(sh: Shape) -> int:
    """A checkpointed chunk's input: all full recompute keeps of it."""
    return sh.tokens_sp * sh.hidden * sh.act_bytes


def head_bytes(sh: Shape) -> int:
    """Final norm, output-layer input and the cross entropy's saved softmax (last stage)."""
    out = _norm(sh) + sh.tokens_sp * sh.hidden * sh.act_bytes + sh.tokens * 9  # ids, mask
    if not sh.fused_ce:
        out += sh.tokens * sh.vocab // sh.tp * _FP32
    return out


def logits_grad_bytes(sh: Shape) -> int:
    """What the cross entropy's backward allocates on top of the activations (the last stage's
    first backward step): the whole fp32 logits' gradient [x, V/t] on the plain path; with
    --cross-entropy-loss-fusion only chunk-sized buffers (`chunked_ce_backward_bytes`)."""
    if sh.fused_ce:
        return chunked_ce_backward_bytes(
            tokens=sh.tokens, vocab=sh.vocab // sh.tp, hidden=sh.hidden, act_bytes=sh.act_bytes
        )
    return sh.tokens * sh.vocab // sh.tp * _FP32


def chunked_ce_backward_bytes(
    *, tokens: int, vocab: int, hidden: int, act_bytes: int, chunk: int = CHUNK_SIZE
) -> int:
    """Peak bytes the chunked cross entropy's backward (`recompute=True`) allocates, for
    `tokens` N, this rank's `vocab` V, chunks of c = min(chunk, N) tokens, e bytes per element:
    dX [N, h] (e), the fp32 dW accumulator [V, h], and per chunk the recomputed logits and their
    gradient D ([c, V] each, e: on CUDA the elementwise helpers are compiled, so no fp32 [c, V]
    exists). A chunk's logits and D stay bound until the next chunk's replace them, so from the
    second chunk on three [c, V] buffers are alive at once; with one chunk the peak is its two
    buffers plus the matmul's dW [V, h] (e) and x_c·g [c, h] before the fp32 add."""
    c = min(chunk, tokens)
    per_chunk = c * vocab * act_bytes
    buffers = 2 * per_chunk + vocab * hidden * act_bytes + c * hidden * act_bytes
    if tokens > c:
        buffers = max(buffers, 3 * per_chunk)
    return tokens * hidden * act_bytes + vocab * hidden * _FP32 + buffers


def layer_grad_bytes(sh: Shape) -> int:
    """Gradients alive while a layer's backward starts: its output's and fc2 input's."""
    return sh.tokens * (sh.hidden + sh.ffn // sh.tp) * sh.act_bytes
