"""`python -m gigatron.training.pretrain_t5`: Megatron's pretrain_t5.py.

T5Model (local specs) trained on T5MaskedWordPieceDataset span-corruption samples; the loss is
the decoder's masked-LM mean over the loss mask. Megatron's flags plus its T5 ones
(`--encoder-num-layers`, `--decoder-num-layers`, `--encoder-seq-length` (= --seq-length),
`--decoder-seq-length`, `--mask-prob`, `--short-seq-prob`). The tokenizer needs [MASK], [PAD],
BOS/EOS and `<extra_id_i>` sentinels (looked up as in pretrain_bert).

Pipeline parallelism is Megatron's encoder/decoder split at `--pipeline-model-parallel-size 2`
(`--pipeline-model-parallel-split-rank 1`, the only split supported): stage 0 embeds and runs the
encoder, stage 1 embeds the decoder tokens, runs the decoder and the LM head, receiving the
encoder output [se, b, h] through the ordinary 1F1B schedule. Both stages hold word and position
embeddings: the embedding group (first, last) and the position-embedding group
(`t5_position_embedding_ranks`: first, split) sum their grads in finalize_model_grads.
"""

from __future__ import annotations

import copy
import sys
from functools import partial

from gigatron.core import parallel_state
from gigatron.core.datasets.t5_dataset import (
    T5MaskedWordPieceDataset,
    T5MaskedWordPieceDatasetConfig,
)
from gigatron.core.models.T5 import T5Model
from gigatron.core.transformer.enums import ModelType
from gigatron.training import _pretrain_common as common
from gigatron.training.global_vars import get_args, get_tokenizer
from gigatron.training.initialize import destroy_distributed
from gigatron.training.pretrain_bert import MaskedLMTokenizer
from gigatron.training.training import pretrain


def add_t5_args(parser):
    """Megatron's T5/masking flags."""
    g = parser.add_argument_group("t5")
    g.add_argument("--encoder-num-layers", type=int, default=None, help="encoder layers")
    g.add_argument("--decoder-num-layers", type=int, default=None, help="decoder layers")
    g.add_argument("--encoder-seq-length", type=int, default=None, help="= --seq-length")
    g.add_argument("--decoder-seq-length", type=int, default=None, help="decoder length")
    common.add_masking_args(g)
    g.add_argument("--pipeline-model-parallel-split-rank", type=int, default=None,
                   help="first decoder stage (only 1, with PP = 2)")  # fmt: skip
    return parser


def _split_rank(args) -> int | None:
    """The first decoder stage under PP, after checking the layout is one gigatron runs."""
    pp = args.pipeline_model_parallel_size
    split = getattr(args, "pipeline_model_parallel_split_rank", None)
    if pp == 1:
        if split is not None:
            raise ValueError(
                f"pipeline_model_parallel_split_rank ({split}) needs "
                "pipeline_model_parallel_size > 1 (pretrain_t5.py)"
            )
        return None
    if pp != 2 or split not in (None, 1):
        raise ValueError(
            f"pipeline_model_parallel_size ({pp}) / pipeline_model_parallel_split_rank ({split}): "
            "pretrain_t5 splits T5 as encoder on stage 0 and decoder on stage 1 only "
            "(PP = 2, split rank 1; deeper splits would pass two tensors between decoder "
            "stages, which gigatron's schedules do not) (pretrain_t5.py)"
        )
    if args.virtual_pipeline_model_parallel_size is not None:
        raise ValueError(
            f"virtual_pipeline_model_parallel_size ({args.virtual_pipeline_model_parallel_size}) "
            "must be None for T5's encoder/decoder split (pretrain_t5.py)"
        )
    return 1


def t5_position_embedding_ranks(pp_ranks: list[int]) -> list[int]:
    """Stages holding position embeddings under the encoder/decoder split: the first (encoder)
    stage and the first decoder stage (Megatron's `default_position_embedding_ranks` with a
    split rank)."""
    if len(pp_ranks) == 1:
        return [pp_ranks[0]]
    return [pp_ranks[0], pp_ranks[1]]


def model_provider(pre_process: bool = True, post_process: bool = True, vp_stage=None):
    """T5Model from the flags: encoder of --encoder-num-layers, decoder of
    --decoder-num-layers (both default --num-layers)."""
    from gigatron.core.models.T5.t5_spec import (
        get_t5_decoder_with_local_block_spec,
        get_t5_encoder_with_local_block_spec,
    )
    from gigatron.training._config_from_args import core_transformer_config_from_args

    args = get_args()
    split = _split_rank(args)
    add_encoder = add_decoder = True
    if split is not None:
        # Both stages embed (encoder tokens on stage 0, decoder tokens on the split stage).
        stage = parallel_state.get_pipeline_model_parallel_rank()
        add_encoder, add_decoder = stage < split, stage >= split
        pre_process = True
    config = core_transformer_config_from_args(args)
    encoder_config = copy.deepcopy(config)
    encoder_config.num_layers = args.encoder_num_layers or args.num_layers
    config.num_layers = args.decoder_num_layers or args.num_layers
    return T5Model(
        config=config,
        encoder_config=encoder_config,
        transformer_encoder_layer_spec=get_t5_encoder_with_local_block_spec(
            encoder_config.num_layers
        ),
        transformer_decoder_layer_spec=get_t5_decoder_with_local_block_spec(config.num_layers),
        **common.language_model_kwargs(args, pre_process, post_process),
        add_encoder=add_encoder,
        add_decoder=add_decoder,
    )


def get_batch(data_iterator):
    """(tokens_enc, tokens_dec, labels, loss_mask, enc_mask, dec_mask, enc_dec_mask): ids
    [b, s], masks bool [b, 1, sq, sk] for the local layers (True = masked)."""

    keys = ("text_enc", "text_dec", "labels", "loss_mask", "enc_mask", "dec_mask")
    batch = common.batch_to_device(next(data_iterator), keys, long=True)
    tokens_enc, tokens_dec, labels, loss_mask, enc_mask, dec_mask = [batch[k] for k in keys]
    masks = T5MaskedWordPieceDataset.config_attention_mask(
        tokens_enc, tokens_dec, enc_mask, dec_mask, use_local=True
    )
    return tokens_enc, tokens_dec, labels, loss_mask, *masks


def loss_func(loss_mask, output_tensor):
    """Decoder masked-LM mean over the loss mask; a [value, 1] report."""
    lm_loss = common.masked_mean(output_tensor, loss_mask)
    return lm_loss, {"lm loss": common.mean_report(lm_loss)}


def forward_step(data_iterator, model):
    tokens_enc, tokens_dec, labels, loss_mask, enc_mask, dec_mask, enc_dec_mask = get_batch(
        data_iterator
    )
    output_tensor = model(
        tokens_enc, tokens_dec, enc_mask, dec_mask, enc_dec_mask, lm_labels=labels
    )
    return output_tensor, partial(loss_func, loss_mask)


def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):
    """T5MaskedWordPieceDataset splits (Megatron's pretrain_t5 masking settings)."""

    args = get_args()
    common.require_corpus(args, "pretrain_t5")
    tokenizer = MaskedLMTokenizer(get_tokenizer()).require(
        "mask", "pad", "bos", "eos", "sentinels", script="pretrain_t5"
    )
    config = T5MaskedWordPieceDatasetConfig(
        **common.dataset_config_kwargs(args, tokenizer),
        sequence_length_decoder=args.decoder_seq_length,
        **common.masking_config_kwargs(args, max_ngram=10, geometric=True),
    )
    return common.build_datasets(T5MaskedWordPieceDataset, train_val_test_num_samples, config, "T5")


train_valid_test_datasets_provider.is_distributed = True


def _with_encoder_seq_length(argv: list[str]) -> list[str]:
    """Megatron's T5 takes --encoder-seq-length as the sequence length and --encoder-num-layers
    as --num-layers (its validate_args fills one from the other), so Megatron's T5 scripts,
    which give only the encoder/decoder flags, run unchanged."""
    for alias, name in (
        ("--encoder-seq-length", "--seq-length"),
        ("--encoder-num-layers", "--num-layers"),
    ):
        if alias in argv and name not in argv:
            argv = argv + [name, argv[argv.index(alias) + 1]]
    return argv


def main(argv: list[str] | None = None):
    """Parse Megatron's flags (plus the T5 ones) and train; returns pretrain's result."""
    argv = _with_encoder_seq_length(list(sys.argv[1:] if argv is None else argv))
    result = pretrain(
        train_valid_test_datasets_provider,
        model_provider,
        ModelType.encoder_or_decoder,
        forward_step,
        extra_args_provider=add_t5_args,
        get_position_embedding_ranks=t5_position_embedding_ranks,
        args_defaults={"tokenizer_type": "BertWordPieceLowerCase"},  # Megatron's default
        argv=argv,
    )
    destroy_distributed()  # a clean exit (the process group this entry point created)
    return result


if __name__ == "__main__":  # the program: configuration errors as one line (gigatron.cli)
    from gigatron.cli import main as cli_main

    sys.exit(cli_main(["train-t5", *sys.argv[1:]]))
