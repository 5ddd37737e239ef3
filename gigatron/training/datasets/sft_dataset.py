"""Supervised fine-tuning data: JSONL conversations packed into fixed-length rows
(Megatron's `megatron.training.datasets.sft_dataset`, used by `pretrain_gpt --sft`).

Each JSONL line is {"messages": [{"role": ..., "content": ...}, ...]}. A line may hold several
conversations back to back: a system message starts a new one. The conversations of one line
are packed into one row of `sequence_length` tokens (the rest padded, the overflow cut):

    tokens        [s]   int64  conversation tokens, then pad ids
    labels        [s]   int64  tokens shifted left by one; IGNORE_INDEX (-100) on prompt tokens
    loss_mask     [s]   fp32   1 on assistant-answer labels, 0 on prompts and padding
    position_ids  [s]   int64  restart at 0 in every conversation
    cu_seqlens    [s+1] int32  conversation bounds, right-filled with s (so samples stack)
    max_seqlen    []    int32  the longest conversation

`pretrain_gpt` turns cu_seqlens into PackedSeqParams (thd), so no conversation attends to
another: a row of several conversations gives each the loss it has alone in a row.

Differences from Megatron: the file is read with `json` (Megatron loads it through the
`datasets` library); padding is masked by position, not by comparing labels with the pad id (a
pad id equal to EOS would otherwise drop the loss on an answer's EOS).
"""

from __future__ import annotations

import json
from typing import Any

import numpy
import torch

from gigatron.core.datasets.gpt_dataset import GPTDatasetConfig
from gigatron.core.datasets.megatron_dataset import MegatronDataset
from gigatron.core.datasets.utils import Split
from gigatron.core.tokenizers.text.libraries.sft_tokenizer import IGNORE_INDEX

__all__ = ["IGNORE_INDEX", "SFTDataset", "SFTLowLevelDataset"]


class SFTLowLevelDataset:
    """The `messages` lists of a JSONL file, one per line (blank lines skipped)."""

    def __init__(self, dataset_path: str) -> None:
        path = dataset_path if dataset_path.endswith(".jsonl") else dataset_path + ".jsonl"
        try:
            with open(path, encoding="utf-8") as f:
                lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
        except FileNotFoundError:
            raise FileNotFoundError(
                f"--data-path {dataset_path}: {path} does not exist (--sft reads JSONL files of "
                '{"messages": [...]} lines)'
            ) from None
        self.messages: list[list[dict]] = []
        for n, line in lines:
            try:
                messages = json.loads(line)["messages"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ValueError(
                    f'{path}:{n}: each line must be a JSON object with a "messages" list'
                ) from None
            if not isinstance(messages, list) or not messages:
                raise ValueError(f'{path}:{n}: "messages" must be a non-empty list')
            self.messages.append(messages)

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, idx: int) -> list[dict]:
        return self.messages[idx]


def split_conversations(messages: list[dict]) -> list[list[dict]]:
    """A line's messages cut before every system message (each starts a conversation)."""
    out: list[list[dict]] = []
    for message in messages:
        if message.get("role") == "system" or not out:
            out.append([])
        out[-1].append(message)
    return out


class SFTDataset(MegatronDataset):
    """One packed row per JSONL line (see the module docstring); `indices` pick the lines of
    this split, `num_samples` rows cycle over them."""

    def __init__(
        self,
        dataset: SFTLowLevelDataset,
        dataset_path: str | None,
        indices: numpy.ndarray,
        num_samples: int | None,
        index_split: Split,
        config: GPTDatasetConfig,
    ) -> None:
        super().__init__(dataset, dataset_path, indices, num_samples, index_split, config)
        if config.reset_position_ids or config.reset_attention_mask:
            raise ValueError(
                "--sft packs conversations with their own bounds: --reset-position-ids and "
                "--reset-attention-mask must be off"
            )
        if num_samples is None:
            self.num_samples = len(indices)

    @staticmethod
    def numel_low_level_dataset(low_level_dataset: SFTLowLevelDataset) -> int:
        return len(low_level_dataset)

    @staticmethod
    def build_low_level_dataset(dataset_path: str, config: GPTDatasetConfig) -> SFTLowLevelDataset:
        return SFTLowLevelDataset(dataset_path)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, idx: int) -> dict[str, Any]:
        if len(self.indices) == 0:
            raise IndexError(f"SFTDataset ({self.index_split.name}) has no lines")
        messages = self.dataset[int(self.indices[idx % len(self.indices)])]
        return pack_conversations(
            split_conversations(messages),
            self.config.tokenizer,
            self.config.sequence_length,
            pad_multiple=2 * self.config.context_parallel_size
            if self.config.context_parallel_size > 1
            else 1,
        )


def pack_conversations(
    conversations: list[list[dict]], tokenizer, seq_length: int, *, pad_multiple: int = 1
) -> dict[str, torch.Tensor]:
    """Conversations -> one row of `seq_length` (keys and shapes in the module docstring).
    Tokens are laid out for seq_length + 1 positions, then shifted into tokens / labels."""
    pad = tokenizer.pad
    tokens: list[int] = []
    targets: list[int] = []
    positions: list[int] = []
    is_pad: list[bool] = []
    bounds = [0]

    def add_padding(n: int) -> None:
        start = positions[-1] + 1 if positions else 0
        tokens.extend([pad] * n)
        targets.extend([IGNORE_INDEX] * n)
        positions.extend(range(start, start + n))
        is_pad.extend([True] * n)

    for conversation in conversations:
        ids, target = tokenizer.tokenize_conversation(
            conversation, return_target=True, add_generation_prompt=False
        )
        tokens.extend(ids.tolist())
        targets.extend(target.tolist())
        positions.extend(range(len(ids)))
        is_pad.extend([False] * len(ids))
        if len(tokens) % pad_multiple:  # context parallelism splits each into 2*cp chunks
            add_padding(pad_multiple - len(tokens) % pad_multiple)
        bounds.append(len(tokens))
        if len(tokens) >= seq_length + 1:  # cut on the right; the last label is padding
            del tokens[seq_length:], targets[seq_length:], is_pad[seq_length:]
            del positions[seq_length + 1 :]
            tokens.append(pad)
            targets.append(IGNORE_INDEX)
            is_pad.append(True)
            bounds[-1] = seq_length
            break
    if len(tokens) < seq_length + 1:
        add_padding(seq_length + 1 - len(tokens))
        bounds[-1] = seq_length  # the padding joins the last conversation
    labels = torch.tensor(targets[1:], dtype=torch.int64)
    keep = (labels != IGNORE_INDEX) & ~torch.tensor(is_pad[1:])
    cu = torch.tensor(bounds, dtype=torch.int32)
    cu_seqlens = torch.full((seq_length + 1,), seq_length, dtype=torch.int32)
    cu_seqlens[: cu.numel()] = cu
    return {
        "tokens": torch.tensor(tokens[:-1], dtype=torch.int64),
        "labels": labels,
        "loss_mask": keep.to(torch.float32),
        "position_ids": torch.tensor(positions[:-1], dtype=torch.int64),
        "cu_seqlens": cu_seqlens,
        "max_seqlen": (cu[1:] - cu[:-1]).max(),
    }
