"""`python -m gigatron.training.pretrain_t5`: Megatron's pretrain_t5.py.

T5Model (local specs) trained on T5MaskedWordPieceDataset span-corruption samples; the loss is
the decoder's masked-LM mean over the loss mask. Megatron's flags plus its T5 ones
(`--encoder-num-layers`, `--decoder-num-layers`, `--encoder-seq-length` (= --seq-length),
`--decoder-seq-length`, `--mask-prob`, `--short-seq-prob`). The tokenizer needs [MASK], [PAD],
BOS/EOS and `<extra_id_i>` sentinels (looked up as in pretrain_bert). Pipeline parallelism: the
script builds one stack per stage only (PP = 1); T5Model's encoder/decoder split is tested at the
model level (tests/dist/test_t5_parallel.py).
"""

from __future__ import annotations

import copy
import sys
from functools import partial

import torch

from gigatron.core.transformer.enums import ModelType
from gigatron.training.global_vars import get_args, get_tokenizer
from gigatron.training.pretrain_bert import MaskedLMTokenizer
from gigatron.training.training import pretrain
from gigatron.training.utils import print_rank_0


def add_t5_args(parser):
    """Megatron's T5/masking flags."""
    g = parser.add_argument_group("t5")
    g.add_argument("--encoder-num-layers", type=int, default=None, help="encoder layers")
    g.add_argument("--decoder-num-layers", type=int, default=None, help="decoder layers")
    g.add_argument("--encoder-seq-length", type=int, default=None, help="= --seq-length")
    g.add_argument("--decoder-seq-length", type=int, default=None, help="decoder length")
    g.add_argument("--mask-prob", type=float, default=0.15, help="masking probability")
    g.add_argument("--short-seq-prob", type=float, default=0.1,
                   help="probability of a shorter sample")  # fmt: skip
    return parser


def model_provider(pre_process: bool = True, post_process: bool = True, vp_stage=None):
    """T5Model from the flags: encoder of --encoder-num-layers, decoder of
    --decoder-num-layers (both default --num-layers)."""
    from gigatron.core.models.T5 import T5Model
    from gigatron.core.models.T5.t5_spec import (
        get_t5_decoder_with_local_block_spec,
        get_t5_encoder_with_local_block_spec,
    )
    from gigatron.training._config_from_args import core_transformer_config_from_args

    args = get_args()
    if args.pipeline_model_parallel_size != 1:
        raise ValueError(
            f"pipeline_model_parallel_size ({args.pipeline_model_parallel_size}) must be 1 in "
            "pretrain_t5 (see the module docstring)"
        )
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
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type,
    )


def get_batch(data_iterator):
    """(tokens_enc, tokens_dec, labels, loss_mask, enc_mask, dec_mask, enc_dec_mask): ids
    [b, s], masks bool [b, 1, sq, sk] for the local layers (True = masked)."""
    from gigatron.core.datasets.t5_dataset import T5MaskedWordPieceDataset

    batch = next(data_iterator)
    device = (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    )
    keys = ("text_enc", "text_dec", "labels", "loss_mask", "enc_mask", "dec_mask")
    tokens_enc, tokens_dec, labels, loss_mask, enc_mask, dec_mask = [
        batch[k].long().to(device) if device is not None else batch[k].long() for k in keys
    ]
    masks = T5MaskedWordPieceDataset.config_attention_mask(
        tokens_enc, tokens_dec, enc_mask, dec_mask, use_local=True
    )
    return tokens_enc, tokens_dec, labels, loss_mask, *masks


def loss_func(loss_mask, output_tensor):
    """Decoder masked-LM mean over the loss mask; a [value, 1] report."""
    loss_mask = loss_mask.float().view(-1)
    lm_loss = torch.sum(output_tensor.float().view(-1) * loss_mask) / loss_mask.sum().clamp(min=1)
    one = torch.ones(1, device=lm_loss.device)
    return lm_loss, {"lm loss": torch.cat([lm_loss.detach().view(1), one])}


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
    from gigatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from gigatron.core.datasets.t5_dataset import (
        T5MaskedWordPieceDataset,
        T5MaskedWordPieceDatasetConfig,
    )
    from gigatron.core.datasets.utils import get_blend_from_list

    args = get_args()
    tokenizer = MaskedLMTokenizer(get_tokenizer()).require("mask", "pad", "bos", "eos")
    config = T5MaskedWordPieceDatasetConfig(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        sequence_length_decoder=args.decoder_seq_length,
        blend=get_blend_from_list(args.data_path),
        split=args.split,
        path_to_cache=args.data_cache_path,
        tokenizer=tokenizer,
        masking_probability=args.mask_prob,
        short_sequence_probability=args.short_seq_prob,
        masking_max_ngram=10,
        masking_do_full_word=True,
        masking_do_permutation=False,
        masking_use_longer_ngrams=False,
        masking_use_geometric_distribution=True,
    )
    print_rank_0("> building T5 train, validation and test datasets ...")
    return BlendedMegatronDatasetBuilder(
        T5MaskedWordPieceDataset, train_val_test_num_samples, lambda: True, config
    ).build()


train_valid_test_datasets_provider.is_distributed = True


def _with_encoder_seq_length(argv: list[str]) -> list[str]:
    """Megatron's T5 takes --encoder-seq-length as the sequence length."""
    if "--encoder-seq-length" in argv and "--seq-length" not in argv:
        argv = argv + ["--seq-length", argv[argv.index("--encoder-seq-length") + 1]]
    return argv


def main(argv: list[str] | None = None):
    """Parse Megatron's flags (plus the T5 ones) and train; returns pretrain's result."""
    argv = _with_encoder_seq_length(list(sys.argv[1:] if argv is None else argv))
    return pretrain(
        train_valid_test_datasets_provider,
        model_provider,
        ModelType.encoder_or_decoder,
        forward_step,
        extra_args_provider=add_t5_args,
        argv=argv,
    )


if __name__ == "__main__":
    main()
    sys.exit(0)
