"""`gigatron train-hybrid` / `python -m gigatron.training.pretrain_hybrid`: Megatron's
pretrain_hybrid.py (pretrain_mamba.py is its deprecated name). GPT data, batches and loss
(pretrain_gpt's), the model from `hybrid_builder`; flags as `gigatron train` plus the hybrid
group (`--hybrid-layer-pattern`, `--mamba-*`; docs/hybrid.md)."""

from __future__ import annotations

import sys
from functools import partial

from gigatron.core.transformer.enums import ModelType
from gigatron.training.hybrid_builders import hybrid_builder
from gigatron.training.initialize import destroy_distributed
from gigatron.training.model_provider import model_provider as _model_provider
from gigatron.training.pretrain_gpt import forward_step, train_valid_test_datasets_provider
from gigatron.training.training import pretrain

model_provider = partial(_model_provider, hybrid_builder)

__all__ = ["forward_step", "main", "model_provider", "train_valid_test_datasets_provider"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pretrain(
        train_valid_test_datasets_provider,
        model_provider,
        ModelType.encoder_or_decoder,
        forward_step,
        args_defaults={"tokenizer_type": "GPT2BPETokenizer"},
        argv=argv,
    )
    destroy_distributed()
    return 0


if __name__ == "__main__":  # the program: configuration errors as one line (gigatron.cli)
    from gigatron.cli import main as cli_main

    sys.exit(cli_main(["train-hybrid", *sys.argv[1:]]))
