"""Files a training run writes beside its checkpoints: the tokenizer's files in
`<checkpoint>/tokenizer/` and saved gradients / activations (`<save>/<label>/iter_N/`).

Helpers of `megatron.training.checkpointing` (`save_tokenizer_assets`, `save_grads`), re-exported
there.
"""

from __future__ import annotations

import logging
import os
import shutil

import torch

# tokenizer type -> ((config attribute, file name in <checkpoint>/tokenizer/), ...)
_TOKENIZER_FILES = {
    "BertWordPieceLowerCase": (("vocab_file", "vocab.txt"),),
    "BertWordPieceCase": (("vocab_file", "vocab.txt"),),
    "GPT2BPETokenizer": (("vocab_file", "vocab.json"), ("merge_file", "merges.txt")),
    "SentencePieceTokenizer": (("tokenizer_model", "tokenizer.model"),),
    "GPTSentencePieceTokenizer": (("tokenizer_model", "tokenizer.model"),),
    "Llama2Tokenizer": (("tokenizer_model", "tokenizer.model"),),
    "TikTokenizer": (("tokenizer_model", "tokenizer.json"),),
}
_SAVE_PRETRAINED_TYPES = ("HuggingFaceTokenizer", "MultimodalTokenizer", "SFTTokenizer")


def _absolute(path: str) -> str:
    return os.path.abspath(path) if path else path


def save_tokenizer_assets(tokenizer, config, checkpoint_path: str, log: logging.Logger) -> None:
    """Rank 0 writes the tokenizer's files into `<checkpoint_path>/tokenizer/`: Hugging Face
    and multimodal tokenizers through `save_pretrained` (of the tokenizer or its
    `_tokenizer`), file-based ones by copying their vocab / merges / model files (relative
    paths from the working directory), NullTokenizer nothing. A missing file is logged at
    debug level; any error is logged, never raised (the checkpoint itself is what matters)."""
    if tokenizer is None:
        return
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    if rank != 0:
        return
    try:
        tokenizer_dir = os.path.join(checkpoint_path, "tokenizer")
        os.makedirs(tokenizer_dir, exist_ok=True)
        kind = config.tokenizer_type
        if kind in _SAVE_PRETRAINED_TYPES:
            log.debug(f"Saving {kind} files to {tokenizer_dir}")
            if hasattr(tokenizer, "save_pretrained"):
                tokenizer.save_pretrained(tokenizer_dir)
            elif hasattr(getattr(tokenizer, "_tokenizer", None), "save_pretrained"):
                tokenizer._tokenizer.save_pretrained(tokenizer_dir)
            else:
                log.debug(f"{kind} has no save_pretrained(); no tokenizer files saved")
            return
        for attr, name in _TOKENIZER_FILES.get(kind, ()):
            source = _absolute(getattr(config, attr, None))
            if source and os.path.exists(source):
                shutil.copy2(source, os.path.join(tokenizer_dir, name))
                log.debug(f"Copied {attr}: {source} -> {tokenizer_dir}/{name}")
            else:
                log.debug(f"{attr} not found at resolved path: {source}")
    except Exception as e:  # noqa: BLE001  (Megatron's contract: log, never fail the save)
        log.error(f"Failed to save tokenizer files: {e}", exc_info=True)


def save_grads(save_dir: str, state_dict, iteration: int, grad_label: str) -> None:
    """Write a dict of tensors (gradients, activations) to
    `<save_dir>/<grad_label>/iter_<iteration:07d>/mp_rank_<tp:02d>[_<pp:03d>][_<ep:03d>].pth`,
    on expert-data-parallel rank 0 only (other DP replicas hold the same values)."""
    from datetime import datetime

    from gigatron.core import parallel_state as ps
    from gigatron.training.utils.common_utils import print_rank_0

    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")
    print_rank_0(f"  [{stamp}] saving {grad_label} from iteration {iteration:7d}")
    if ps.get_expert_data_parallel_rank() != 0:
        return
    if save_dir is None or iteration is None:
        raise ValueError(
            f"save_grads needs a save_dir and an iteration, got {save_dir!r}, {iteration!r}"
        )
    out_dir = os.path.join(save_dir, grad_label, f"iter_{iteration:07d}")
    os.makedirs(out_dir, exist_ok=True)
    name = f"mp_rank_{ps.get_tensor_model_parallel_rank():02d}"
    if ps.get_pipeline_model_parallel_world_size() > 1:
        name += f"_{ps.get_pipeline_model_parallel_rank():03d}"
    if ps.get_expert_model_parallel_world_size() > 1:
        name += f"_{ps.get_expert_model_parallel_rank():03d}"
    torch.save(dict(state_dict), os.path.join(out_dir, f"{name}.pth"))
