"""What pretrain_gpt / pretrain_bert / pretrain_t5 share (Megatron repeats it in each script).

Not a Megatron module: Megatron's pretrain_*.py each carry their own copy of the batch move, the
masked loss and the dataset-builder call; gigatron keeps one here. The scripts keep Megatron's
public names (model_provider, forward_step, train_valid_test_datasets_provider, get_batch,
loss_func) and build on these helpers.
"""

from __future__ import annotations

import torch

from gigatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from gigatron.training.utils import args_by_name, print_rank_0


def current_device() -> torch.device | None:
    """This rank's CUDA device, or None on CPU (tensors stay where the data loader put them)."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return None


def batch_to_device(batch: dict, keys, *, long: bool = False, non_blocking: bool = False) -> dict:
    """{key: tensor} for the `keys` present in `batch` (None values kept as None), each cast to
    int64 when `long` and moved to `current_device()` when there is one."""
    device = current_device()
    out = {}
    for k in keys:
        if k not in batch:
            continue
        v = batch[k]
        if v is not None and long:
            v = v.long()
        if v is not None and device is not None:
            v = v.to(device, non_blocking=non_blocking)
        out[k] = v
    return out


def masked_sum_and_count(
    losses: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of per-token `losses` [b, s] over `loss_mask` [b, s], number of masked tokens): both
    0-d fp32 tensors."""
    losses = losses.view(-1).float()
    loss_mask = loss_mask.view(-1).float()
    return torch.sum(losses * loss_mask), loss_mask.sum()


def masked_mean(losses: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean of per-token `losses` over `loss_mask` (count clamped to >= 1): a 0-d fp32 tensor."""
    total, count = masked_sum_and_count(losses, loss_mask)
    return total / count.clamp(min=1)


def mean_report(value: torch.Tensor) -> torch.Tensor:
    """[value, 1]: a loss already averaged, reported as (sum, count) with count 1."""
    return torch.cat([value.detach().view(1), torch.ones(1, device=value.device)])


def language_model_kwargs(args, pre_process: bool, post_process: bool) -> dict:
    """The LanguageModule constructor arguments every script takes from the flags."""
    return dict(
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        **args_by_name(args, "position_embedding_type"),
    )


def add_masking_args(group) -> None:
    """Megatron's `--mask-prob` / `--short-seq-prob` (BERT and T5)."""
    group.add_argument("--mask-prob", type=float, default=0.15, help="masking probability")
    group.add_argument("--short-seq-prob", type=float, default=0.1,
                       help="probability of a shorter sample")  # fmt: skip


def dataset_config_kwargs(args, tokenizer) -> dict:
    """The BlendedMegatronDatasetConfig fields every script takes from the flags."""
    from gigatron.core.datasets.utils import get_blend_from_list

    return dict(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        blend=get_blend_from_list(args.data_path),
        **args_by_name(args, "split"),
        path_to_cache=args.data_cache_path,
        tokenizer=tokenizer,
    )


def masking_config_kwargs(args, *, max_ngram: int, geometric: bool) -> dict:
    """MaskedWordPieceDatasetConfig fields shared by BERT (max_ngram 3) and T5 (10, geometric)."""
    return dict(
        masking_probability=args.mask_prob,
        short_sequence_probability=args.short_seq_prob,
        masking_max_ngram=max_ngram,
        masking_do_full_word=True,
        masking_do_permutation=False,
        masking_use_longer_ngrams=False,
        masking_use_geometric_distribution=geometric,
    )


def build_datasets(cls, train_val_test_num_samples, config, name: str):
    """(train, valid, test) of `cls` through BlendedMegatronDatasetBuilder, built on every rank."""

    print_rank_0(f"> building {name} train, validation and test datasets ...")
    return BlendedMegatronDatasetBuilder(
        cls, train_val_test_num_samples, lambda: True, config
    ).build()


def require_corpus(args, name: str) -> None:
    """BERT / T5 sample masked spans from a sentence-split corpus: refuse --mock-data (gigatron
    has no mock masked-LM dataset; the flag was ignored and the run failed later inside the
    tokenizer with 'NullTokenizer has no vocab')."""
    if args.mock_data:
        raise ValueError(
            f"--mock-data: {name} has no mock dataset; give --data-path PREFIX (a corpus "
            "written by `gigatron preprocess`) and a tokenizer with the mask / pad / special "
            "tokens"
        )
