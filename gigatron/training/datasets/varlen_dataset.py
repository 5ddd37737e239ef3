"""Schema detection and message normalization for variable-length SFT-style data (the sample
converters of `megatron.training.datasets.varlen_dataset`).

A data set's columns pick a converter (most explicit first):
  openai-messages  `messages`                 -> the list, with a leading system turn
  sharegpt         `conversations`            -> roles mapped from "from", system turn added
  alpaca / dolly   an instruction and an output column (synonyms below), optional context
  pretrain-text    `text`                     -> the raw string (no chat template)
Content must be a plain string: multi-modal content lists are a ValueError.

gigatron has these converters only; Megatron's packed `VarlenDataset` / `MockVarlenDataset`
(built on its SFT dataset and Hugging Face loaders) are not provided.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

_INSTRUCTION_FIELDS = ("instruction", "prompt", "query", "question")
_OUTPUT_FIELDS = ("output", "response", "completion", "answer")
_EXTRA_INPUT_FIELDS = ("input", "context")  # Alpaca's "input", Dolly's "context"

# ShareGPT speaker -> chat role; an unknown speaker is a user.
_SHAREGPT_ROLE_MAP = {
    **dict.fromkeys(("human", "user"), "user"),
    **dict.fromkeys(("gpt", "assistant", "model", "chatgpt", "bing", "bard"), "assistant"),
    "system": "system",
    **dict.fromkeys(("tool", "function", "observation"), "tool"),
}

Messages = list[dict[str, str]]


def _looks_like_hf_id(path: str | None) -> bool:
    """True for an `owner/repo` Hugging Face id: has a '/', is not an absolute or ./ ../
    path, and names nothing on the local file system."""
    if not path or os.path.exists(path) or path.startswith(("/", "./", "../")):
        return False
    return "/" in path


def _first_present(sample: dict[str, Any], fields: Iterable[str]) -> str | None:
    """The first non-empty value among `fields`; it must be a string."""
    for field in fields:
        value = sample.get(field)
        if value in (None, ""):
            continue
        if not isinstance(value, str):
            raise ValueError(
                f"VarlenDataset: field '{field}' must be a string, got {type(value).__name__}"
            )
        return value
    return None


def _string_content(content: Any, where: str) -> str:
    if content is None:
        return ""
    if not isinstance(content, str):
        raise ValueError(
            f"VarlenDataset: {where} content must be a string, got {type(content).__name__} "
            "(multi-modal content lists are not supported)"
        )
    return content


def _system(content: str = "") -> dict[str, str]:
    return {"role": "system", "content": content}


def _alpaca_to_messages(sample: dict[str, Any]) -> Messages:
    """[system "", user "instruction[\\n\\ncontext]", assistant output]."""
    instruction = _first_present(sample, _INSTRUCTION_FIELDS) or ""
    extra = _first_present(sample, _EXTRA_INPUT_FIELDS) or ""
    output = _first_present(sample, _OUTPUT_FIELDS) or ""
    user = f"{instruction}\n\n{extra}" if extra else instruction
    return [_system(), {"role": "user", "content": user}, {"role": "assistant", "content": output}]


def _sharegpt_to_messages(sample: dict[str, Any]) -> Messages:
    """`conversations` turns as messages; an empty system turn first unless one is there."""
    turns = sample.get("conversations") or []
    out = []
    if not turns or (turns[0].get("from") or "").lower() != "system":
        out.append(_system())
    for turn in turns:
        role = _SHAREGPT_ROLE_MAP.get((turn.get("from") or "").lower(), "user")
        content = _string_content(turn.get("value"), f"sharegpt turn role={role}")
        out.append({"role": role, "content": content})
    return out


def _messages_passthrough(sample: dict[str, Any]) -> Messages:
    """`messages` with only role and content kept, an empty system turn first if missing."""
    turns = list(sample.get("messages") or [])
    if turns and turns[0].get("role") != "system":
        turns.insert(0, _system())
    out = []
    for turn in turns:
        role = turn.get("role") or "user"
        content = _string_content(turn.get("content"), f"messages turn role={role}")
        out.append({"role": role, "content": content})
    return out


def _raw_text_loader(sample: dict[str, Any]) -> str:
    """The `text` column as it is ("" when missing or None)."""
    text = sample.get("text") or ""
    if not isinstance(text, str):
        raise ValueError(
            "VarlenDataset (pretrain-text schema): 'text' must be a string, "
            f"got {type(text).__name__}"
        )
    return text


def _select_converter(column_names: list[str]) -> tuple[Callable[[dict[str, Any]], Any], str]:
    """(converter, schema name) for a data set with these columns; ValueError when none fits."""
    cols = set(column_names)
    if "messages" in cols:
        return _messages_passthrough, "openai-messages"
    if "conversations" in cols:
        return _sharegpt_to_messages, "sharegpt"
    if cols & set(_INSTRUCTION_FIELDS) and cols & set(_OUTPUT_FIELDS):
        return _alpaca_to_messages, "alpaca"
    if "text" in cols:
        return _raw_text_loader, "pretrain-text"
    raise ValueError(
        f"VarlenDataset cannot infer schema from columns {sorted(cols)}; supported: "
        f"alpaca/dolly ({'|'.join(_INSTRUCTION_FIELDS)} + {'|'.join(_OUTPUT_FIELDS)} "
        f"[+ {'|'.join(_EXTRA_INPUT_FIELDS)}]), sharegpt (conversations), "
        "openai-messages (messages), pretrain-text (text)"
    )
