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
    from gigatron.core import parallel_state
    from gigatron.core.models.T5 import T5Model
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
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type,
        add_encoder=add_encoder,
        add_decoder=add_decoder,
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
        get_position_embedding_ranks=t5_position_embedding_ranks,
        argv=argv,
    )


if __name__ == "__main__":
    main()
    sys.exit(0)
