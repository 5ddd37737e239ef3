"""BERT and T5 as interchangeable test cases: one builder, one batch and one training loss each,
so the twin tests (TP against one rank, parallel_output=False against True) are written once and
run for both models.

A case's `build(tp, variant, parallel_output)` makes the model on CPU from the current torch seed
(the same full weights on every rank, sharded by TP); `outputs(model, batch)` returns the named
outputs to compare (`logits`: `[b, s, V/tp]` when parallel_output, else `[b, s, V]`; `loss`:
per-token `[b, s]`) and the scalar that backward runs on.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from gigatron.core.transformer.transformer_config import TransformerConfig

V, B = 64, 2


def encoder_config(tp: int, sp: bool = False, pp: int = 1) -> TransformerConfig:
    """The tiny fp32 config every BERT / T5 twin test builds from (PP > 1: fp32 p2p)."""
    return TransformerConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        ffn_hidden_size=64,
        activation_func=F.gelu,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        sequence_parallel=sp,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.float32 if pp > 1 else None,
        use_cpu_initialization=True,
    )


class BertCase:
    """BertModel with the binary head and tied embeddings. Variants: sequence parallelism."""

    name, S = "bert", 8
    variants = ("tp", "tp+sp")
    parallel_output_variants = ("tied",)

    def build(self, tp: int, variant: str = "tp", parallel_output: bool = True):
        from gigatron.core.models.bert import BertModel
        from gigatron.core.models.bert.bert_layer_specs import bert_layer_local_spec

        cfg = encoder_config(tp, sp=tp > 1 and variant == "tp+sp")
        return BertModel(
            cfg, 2, bert_layer_local_spec, V, 16, parallel_output=parallel_output,
            share_embeddings_and_output_weights=True,
        )  # fmt: skip

    def batch(self) -> dict:
        g = torch.Generator().manual_seed(5)
        ids = torch.randint(0, V, (B, self.S), generator=g)
        types = (torch.arange(self.S) >= 4).long()[None].expand(B, -1).contiguous()
        mask = torch.ones(B, self.S, dtype=torch.long)
        mask[1, 6:] = 0
        labels = torch.randint(0, V, (B, self.S), generator=g)
        return dict(ids=ids, types=types, mask=mask, labels=labels)

    def outputs(self, model, batch):
        ids, mask, types = batch["ids"], batch["mask"], batch["types"]
        with torch.no_grad():
            logits, _ = model(ids, mask, tokentype_ids=types)
        loss, binary = model(ids, mask, tokentype_ids=types, lm_labels=batch["labels"])
        total = (loss * mask).sum() + F.cross_entropy(binary, torch.tensor([0, 1]))
        return {"logits": logits, "loss": loss, "binary": binary}, total

    def head_grads(self, variant: str) -> tuple[str, ...]:  # must be nonzero (tied: bias, table)
        return ("output_layer.bias", "embedding.word_embeddings.weight")

    @staticmethod
    def labels(batch):
        return batch["labels"]


class T5Case:
    """T5Model with local block specs. Variants: learned or relative positions (TP twin), tied or
    untied LM head (parallel_output twin)."""

    name, SE, SD = "t5", 12, 8
    variants = ("learned_absolute", "relative")
    parallel_output_variants = ("tied", "untied")

    def build(self, tp: int, variant: str = "learned_absolute", parallel_output: bool = True):
        from gigatron.core.models.T5 import T5Model
        from gigatron.core.models.T5.t5_spec import (
            get_t5_decoder_with_local_block_spec,
            get_t5_encoder_with_local_block_spec,
        )

        cfg = encoder_config(tp)
        position = variant if variant in self.variants else "learned_absolute"
        return T5Model(
            cfg,
            dataclasses.replace(cfg),
            get_t5_encoder_with_local_block_spec(2),
            get_t5_decoder_with_local_block_spec(2),
            vocab_size=V,
            max_sequence_length=16,
            parallel_output=parallel_output,
            share_embeddings_and_output_weights=variant != "untied",
            position_embedding_type=position,
        )

    def batch(self) -> dict:
        g = torch.Generator().manual_seed(5)
        enc = torch.randint(1, V, (B, self.SE), generator=g)
        dec = torch.randint(1, V, (B, self.SD), generator=g)
        enc[1, 9:] = 0  # padding, as T5MaskedWordPieceDataset pads with 0
        dec[1, 6:] = 0
        labels = torch.randint(0, V, (B, self.SD), generator=g)

        def masked(q, k):  # Megatron's local-spec masks [b, 1, sq, sk]: True = masked
            return ~((q[:, :, None] >= 1) & (k[:, None, :] >= 1))[:, None]

        causal = torch.ones(self.SD, self.SD, dtype=torch.bool).triu(1)
        return dict(
            encoder_input_ids=enc,
            decoder_input_ids=dec,
            encoder_attn_mask=masked(enc, enc),
            decoder_attn_mask=masked(dec, dec) | causal,
            encoder_decoder_attn_mask=masked(dec, enc),
            lm_labels=labels,
        )

    def outputs(self, model, batch):
        with torch.no_grad():
            logits = model(**{k: v for k, v in batch.items() if k != "lm_labels"})
        loss = model(**batch)  # [b, sd]
        return {"logits": logits, "loss": loss}, loss.sum()

    def head_grads(self, variant: str) -> tuple[str, ...]:
        tied = variant != "untied"
        return ("lm_head.output_layer.bias" if tied else "lm_head.output_layer.weight",)

    @staticmethod
    def labels(batch):
        return batch["lm_labels"]


CASES = {case.name: case for case in (BertCase(), T5Case())}
