"""BERT (mirrors `megatron.core.models.bert`)."""

from gigatron.core.models.bert.bert_model import BertModel

__all__ = ["BertModel"]
