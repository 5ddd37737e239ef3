"""`gigatron train` / `python -m gigatron.training.pretrain_gpt`: Megatron's pretrain_gpt.py.

Accepts Megatron's flags (see `gigatron.training.arguments`). Launch under `torchrun` for
several ranks; without GPUs it runs on CPU through gloo. `--demo` (alone) runs the built-in
demo (`gigatron.training.demo`), which is what `make train` does; no flags at all is an error.
"""

from __future__ import annotations

import sys
from functools import partial

import torch

from gigatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
from gigatron.core.packed_seq_params import PackedSeqParams
from gigatron.core.transformer.enums import ModelType
from gigatron.core.utils import flatten_batch_for_packed_sequences, get_batch_on_this_cp_rank
from gigatron.training import _pretrain_common as common
from gigatron.training.datasets.sft_dataset import SFTDataset
from gigatron.training.global_vars import get_args, get_tokenizer
from gigatron.training.gpt_builders import gpt_builder
from gigatron.training.initialize import destroy_distributed
from gigatron.training.model_provider import model_provider as _model_provider
from gigatron.training.training import pretrain
from gigatron.training.utils import args_by_name

# The model `gigatron generate` and `gigatron estimate` build too (Megatron binds it likewise).
model_provider = partial(_model_provider, gpt_builder)


_BATCH_KEYS = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")


def _next_batch(data_iterator) -> dict:
    """This rank's micro-batch: the _BATCH_KEYS and, for packed samples
    (--dataloader-inter-document-masking), `packed_seq_params` over the [b, s] samples
    flattened into one row [1, b*s] (Megatron's flatten_batch_for_packed_sequences)."""
    batch = next(data_iterator)
    packed = batch.get("cu_seqlens") is not None
    if packed:
        batch = flatten_batch_for_packed_sequences(dict(batch))
    out = common.batch_to_device(batch, (*_BATCH_KEYS, "cu_seqlens"), non_blocking=True)
    out.setdefault("attention_mask", None)
    out = get_batch_on_this_cp_rank(out)
    out["packed_seq_params"] = None
    if packed:
        cu_seqlens = out.pop("cu_seqlens").reshape(-1)
        max_seqlen = int(batch["max_seqlen"].max())
        out["packed_seq_params"] = PackedSeqParams(
            qkv_format="thd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
            max_seqlen_q=max_seqlen, max_seqlen_kv=max_seqlen,
        )  # fmt: skip
    return out


def get_batch(data_iterator):
    """This rank's (tokens, labels, loss_mask, attention_mask, position_ids) for one micro-batch
    ([1, b*s] rows for packed samples; their bounds are in forward_step's packed_seq_params)."""
    batch = _next_batch(data_iterator)
    return tuple(batch[key] for key in _BATCH_KEYS)


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """Sum of masked per-token losses, the token count, and a [sum, count] report (Megatron's)."""
    loss, count = common.masked_sum_and_count(output_tensor, loss_mask)
    num_tokens = count.clone().detach().to(torch.int)
    report = torch.cat([loss.clone().detach().view(1), num_tokens.view(1).float()])
    return loss, num_tokens, {"lm loss": report}


def forward_step(data_iterator, model):
    """Megatron's forward step: the model returns per-token losses when given labels; packed
    samples pass their document bounds as packed_seq_params."""
    batch = _next_batch(data_iterator)
    output_tensor = model(
        batch["tokens"], batch["position_ids"], batch["attention_mask"],
        labels=batch["labels"], loss_mask=batch["loss_mask"],
        packed_seq_params=batch["packed_seq_params"],
    )  # fmt: skip
    return output_tensor, partial(loss_func, batch["loss_mask"])


def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):
    """GPT datasets (or mock ones) from --data-path / --split through the blended builder;
    with --sft, SFTDataset rows of packed JSONL conversations."""

    args = get_args()
    if args.sft:  # JSONL conversations, packed per line (always thd, as Megatron's)
        config = GPTDatasetConfig(
            **common.dataset_config_kwargs(args, get_tokenizer()),
            reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
            create_attention_mask=False, context_parallel_size=args.context_parallel_size,
        )  # fmt: skip
        return common.build_datasets(SFTDataset, train_val_test_num_samples, config, "SFT")
    inter_document_masking = args.dataloader_inter_document_masking
    config = GPTDatasetConfig(
        **common.dataset_config_kwargs(args, get_tokenizer()),
        **args_by_name(args, "reset_position_ids reset_attention_mask eod_mask_loss"),
        create_attention_mask=args.reset_attention_mask and not inter_document_masking,
        inter_document_masking=inter_document_masking,
    )
    cls = MockGPTDataset if args.mock_data else GPTDataset
    return common.build_datasets(cls, train_val_test_num_samples, config, cls.__name__)


train_valid_test_datasets_provider.is_distributed = True


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--demo"]:
        from gigatron.training import demo

        return demo.main([])
    if not argv:  # no silent multi-minute demo: say what to pass
        print(
            "gigatron train: error: no flags given: pass Megatron's pretrain_gpt.py flags "
            "(`gigatron train --help`), or --demo for the built-in demo that `make train` runs "
            "(about 2 minutes on 2 CPU cores)",
            file=sys.stderr,
        )
        return 2
    pretrain(
        train_valid_test_datasets_provider,
        model_provider,
        ModelType.encoder_or_decoder,
        forward_step,
        args_defaults={"tokenizer_type": "GPT2BPETokenizer"},  # Megatron's default
        argv=argv,
    )
    destroy_distributed()  # a clean exit (the process group this entry point created)
    return 0


if __name__ == "__main__":  # the program: configuration errors as one line (gigatron.cli)
    from gigatron.cli import main as cli_main

    sys.exit(cli_main(["train", *sys.argv[1:]]))
