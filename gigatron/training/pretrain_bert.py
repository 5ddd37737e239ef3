"""`python -m gigatron.training.pretrain_bert`: Megatron's pretrain_bert.py.

BertModel (local spec) trained on BERTMaskedWordPieceDataset samples: masked-LM loss (mean over
the masked positions) plus, with the binary head, the sentence-order/next-sentence loss.
Megatron's flags plus its BERT ones (`--bert-no-binary-head`, `--mask-prob`,
`--short-seq-prob`). The tokenizer must know [CLS], [SEP], [MASK] and [PAD]: the WordPiece
specials are looked up in its vocabulary (e.g. `--tokenizer-type HuggingFaceTokenizer
--tokenizer-model DIR_WITH_A_WORDPIECE_tokenizer.json`) when it lacks those attributes.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from functools import partial

import torch.nn.functional as F

from gigatron.core.datasets.bert_dataset import (
    BERTMaskedWordPieceDataset,
    BERTMaskedWordPieceDatasetConfig,
)
from gigatron.core.models.bert import BertModel
from gigatron.core.transformer.enums import ModelType
from gigatron.training import _pretrain_common as common
from gigatron.training.global_vars import get_args, get_tokenizer
from gigatron.training.initialize import destroy_distributed
from gigatron.training.training import pretrain

_SPECIALS = {
    "cls": ("[CLS]", "<cls>"),
    "sep": ("[SEP]", "<sep>"),
    "mask": ("[MASK]", "<mask>"),
    "pad": ("[PAD]", "<pad>"),
    "bos": ("[BOS]", "<s>"),
    "eos": ("[EOS]", "</s>"),
}


class MaskedLMTokenizer:
    """The attributes the masked datasets read (cls, sep, mask, pad, bos, eos, inv_vocab,
    additional_special_tokens_ids = the `<extra_id_i>` sentinels), taken from the wrapped
    tokenizer when it has them, else looked up in its vocabulary by the usual token strings."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        vocab = tokenizer.vocab
        # Sorted by id: the datasets draw random replacement tokens by position in inv_vocab,
        # and a Hugging Face tokenizer's vocabulary comes in a different order in each process.
        self.inv_vocab = dict(sorted(tokenizer.inv_vocab.items()))
        self.vocab_size = tokenizer.vocab_size
        for name, strings in _SPECIALS.items():
            value = _attr(tokenizer, name)
            if value is None:
                value = next((vocab[s] for s in strings if s in vocab), None)
            setattr(self, name, value)
        sentinels = _attr(tokenizer, "additional_special_tokens_ids") or []
        i = 0
        while not sentinels and f"<extra_id_{i}>" in vocab:
            i += 1
        self.additional_special_tokens_ids = sentinels or [
            vocab[f"<extra_id_{k}>"] for k in range(i)
        ]
        self.unique_identifiers = OrderedDict(
            [
                ("class", type(self).__name__),
                ("tokenizer", getattr(tokenizer, "unique_identifiers", None)),
            ]
        )

    def require(self, *names: str, script: str = "pretrain_bert") -> MaskedLMTokenizer:
        """Raise naming `script` unless the tokens `names` (keys of _SPECIALS, or "sentinels":
        at least one `<extra_id_i>`) are known."""
        missing = [n for n in names if n != "sentinels" and getattr(self, n) is None]
        if missing:
            raise ValueError(
                f"the tokenizer has no {missing} token(s); looked for "
                f"{[_SPECIALS[n] for n in missing]} in its vocabulary ({script}.py)"
            )
        if "sentinels" in names and not self.additional_special_tokens_ids:
            raise ValueError(
                "the tokenizer has no <extra_id_i> sentinel tokens, which T5's span corruption "
                "needs: pass --vocab-extra-ids 100 (BertWordPieceLowerCase / BertWordPieceCase "
                f"/ SentencePieceTokenizer) or use a vocabulary that has them ({script}.py)"
            )
        return self


def _attr(tokenizer, name):
    try:
        return getattr(tokenizer, name)
    except (AttributeError, NotImplementedError):
        return None


def add_bert_args(parser):
    """Megatron's BERT/masking flags."""
    g = parser.add_argument_group("bert")
    g.add_argument("--bert-no-binary-head", action="store_false", dest="bert_binary_head",
                   help="no next-sentence (binary) head")  # fmt: skip
    common.add_masking_args(g)
    return parser


def model_provider(pre_process: bool = True, post_process: bool = True, vp_stage=None):
    """BertModel from the flags (Megatron's local BERT layer)."""
    from gigatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
    from gigatron.training._config_from_args import core_transformer_config_from_args

    args = get_args()
    return BertModel(
        config=core_transformer_config_from_args(args),
        num_tokentypes=2 if args.bert_binary_head else 0,
        transformer_layer_spec=bert_layer_local_spec,
        **common.language_model_kwargs(args, pre_process, post_process),
        add_binary_head=args.bert_binary_head,
        vp_stage=vp_stage,
    )


def get_batch(data_iterator):
    """(tokens, types, sentence_order, loss_mask, lm_labels, padding_mask) of one micro-batch."""
    keys = ("text", "types", "is_random", "loss_mask", "labels", "padding_mask")
    batch = common.batch_to_device(next(data_iterator), keys, long=True)
    return [batch[k] for k in keys]


def loss_func(loss_mask, sentence_order, output_tensor):
    """Masked-LM mean over masked positions (+ binary-head CE); [value, 1] reports."""
    lm_loss_, sop_logits = output_tensor
    lm_loss = common.masked_mean(lm_loss_, loss_mask)
    reports = {"lm loss": common.mean_report(lm_loss)}
    loss = lm_loss
    if sop_logits is not None:
        sop_loss = F.cross_entropy(
            sop_logits.view(-1, 2).float(), sentence_order.view(-1), ignore_index=-1
        )
        loss = lm_loss + sop_loss
        reports["sop loss"] = common.mean_report(sop_loss)
    return loss, reports


def forward_step(data_iterator, model):
    tokens, types, sentence_order, loss_mask, lm_labels, padding_mask = get_batch(data_iterator)
    if not get_args().bert_binary_head:
        types = None
    output_tensor = model(tokens, padding_mask, tokentype_ids=types, lm_labels=lm_labels)
    return output_tensor, partial(loss_func, loss_mask, sentence_order)


def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):
    """BERTMaskedWordPieceDataset splits from --data-path / --split (Megatron's settings)."""

    args = get_args()
    common.require_corpus(args, "pretrain_bert")
    tokenizer = MaskedLMTokenizer(get_tokenizer()).require("cls", "sep", "mask", "pad")
    config = BERTMaskedWordPieceDatasetConfig(
        **common.dataset_config_kwargs(args, tokenizer),
        **common.masking_config_kwargs(args, max_ngram=3, geometric=False),
        classification_head=args.bert_binary_head,
    )
    return common.build_datasets(
        BERTMaskedWordPieceDataset, train_val_test_num_samples, config, "BERT"
    )


train_valid_test_datasets_provider.is_distributed = True


def main(argv: list[str] | None = None):
    """Parse Megatron's flags (plus the BERT ones) and train; returns pretrain's result."""
    argv = list(sys.argv[1:] if argv is None else argv)
    result = pretrain(
        train_valid_test_datasets_provider,
        model_provider,
        ModelType.encoder_or_decoder,
        forward_step,
        extra_args_provider=add_bert_args,
        args_defaults={"tokenizer_type": "BertWordPieceLowerCase"},  # Megatron's default
        argv=argv,
    )
    destroy_distributed()  # a clean exit (the process group this entry point created)
    return result


if __name__ == "__main__":  # the program: configuration errors as one line (gigatron.cli)
    from gigatron.cli import main as cli_main

    sys.exit(cli_main(["train-bert", *sys.argv[1:]]))
