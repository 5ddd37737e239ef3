"""Checkpoint helpers of `megatron.training.checkpointing` beyond save / load: the resume
iteration of a --freeze-all-layers run, the tokenizer files a checkpoint carries, and the
test of which Transformer Engine `_extra_state` payloads are worth saving.

gigatron builds no Transformer Engine modules, so its own `_extra_state`s are always empty;
the helpers still judge TE-format payloads (a `torch.save`d dict in a uint8 tensor) as
Megatron does, for state dicts that carry them.
"""

from __future__ import annotations

import logging
import os
import shutil

import torch

from gigatron.core.dist_checkpointing.dict_utils import dict_list_map_inplace
from gigatron.core.dist_checkpointing.mapping import LocalNonpersistentObject, ShardedObject

# Keys TE writes into `_extra_state` only under delayed FP8 scaling (amax history + scales):
# their bytes in the payload mean state that the run's config cannot rebuild.
_DELAYED_SCALING_MARKERS = (b"amax_history_fwd", b"scale_fwd", b"scale_bwd")

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
_SAVE_PRETRAINED_TYPES = ("HuggingFaceTokenizer", "MultimodalTokenizer")


def fp8_extra_state_is_persistent(data) -> bool:
    """Must this `_extra_state` payload be checkpointed?

    None or an empty tensor (no FP8) and a payload without delayed-scaling keys (block or
    current scaling: recipe and config-derived scalars) are not; one with them is. Read from
    the raw bytes, nothing unpickled. Any other type is kept, so no real state is dropped."""
    if data is None:
        return False
    if not isinstance(data, torch.Tensor):
        return True
    if data.numel() == 0:
        return False
    try:
        raw = data.detach().cpu().contiguous().numpy().tobytes()
    except (TypeError, RuntimeError):  # a dtype numpy cannot hold: keep it
        return True
    return any(marker in raw for marker in _DELAYED_SCALING_MARKERS)


def localize_redundant_extra_states(state_dict) -> None:
    """In place: each `ShardedObject` whose key ends in `_extra_state` and whose payload is not
    persistent becomes a `LocalNonpersistentObject` (not written on save; on load the local
    value is put back). Everything else is left as it is."""

    def localize(value):
        if (
            isinstance(value, ShardedObject)
            and value.key.endswith("_extra_state")
            and not fp8_extra_state_is_persistent(value.data)
        ):
            return LocalNonpersistentObject(value.data)
        return value

    dict_list_map_inplace(localize, state_dict)


def frozen_resume_iteration(tracker_filename: str | None, read_metadata) -> int:
    """The iteration in a --freeze-all-layers run's tracker file; 0 when there is none."""
    if tracker_filename is None or not os.path.isfile(tracker_filename):
        return 0
    iteration, _release = read_metadata(tracker_filename)
    return iteration


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
