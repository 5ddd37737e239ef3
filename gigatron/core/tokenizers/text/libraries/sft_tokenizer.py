"""`SFTTokenizer`: a Hugging Face tokenizer's chat template with a target that keeps the loss on
assistant answers only (Megatron's `megatron.core.tokenizers.text.libraries.sft_tokenizer`).

`tokenize_conversation(messages, return_target=True, add_generation_prompt=False)` renders the
conversation through `transformers`' `apply_chat_template` and returns the token ids and the
targets: a copy of the ids with IGNORE_INDEX (-100) on every token that is not an assistant
answer (system and user turns, the assistant header the template puts before an answer).

How the answer tokens are found: for an assistant turn i, its tokens run from the end of the
rendering of messages[:i] with the generation prompt (the assistant header) to the end of the
rendering of messages[:i+1]. This needs the template to be prefix-stable (the tokens of a
shorter conversation start the tokens of a longer one), which chat templates with special tokens
between turns are; a template that is not gives a ValueError naming the turn. Megatron renders
each turn on its own instead and, with the "default" prompt format, masks nothing.

Prompt formats (`--sft-tokenizer-prompt-format`, Megatron's names): "default" (the tokenizer's
own chat template), "identity" (the contents concatenated), "nemotron-h-aligned" and
"nemotron-nano-v2" (Megatron's Nemotron templates; they need the <SPECIAL_*> tokens).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy

IGNORE_INDEX = -100

# fmt: off
_NEMOTRON_H_ALIGNED = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ '<SPECIAL_10>System\n' + message['content'].strip() + '\n' }}"
    "{% elif message['role'] == 'user' %}"
    "{{ '<SPECIAL_11>User\n' + message['content'].strip() + '\n' + '<SPECIAL_11>Assistant\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'].strip() + '\n' }}"
    "{% endif %}{% endfor %}"
)
_NEMOTRON_NANO_V2 = (
    "{% for message in messages %}{% set content = message['content'] %}"
    "{% if message['role'] == 'system' %}{{ '<SPECIAL_10>System\n' + content.replace('/think', "
    "'').replace('/no_think', '').strip() + '\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<SPECIAL_11>User\n' + content.replace('/think', "
    "'').replace('/no_think', '').strip() + '\n' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ '<SPECIAL_11>Assistant\n' + content.strip() + '\n<SPECIAL_12>\n' }}"
    "{% endif %}{% endfor %}"
)
_IDENTITY = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
# fmt: on

PROMPT_FORMATS = ("default", "identity", "nemotron-h-aligned", "nemotron-nano-v2")


@dataclass
class PromptConfig:
    """One prompt format: its template and the special tokens it relies on."""

    assistant_prefix_len: int
    """Tokens of the assistant header inside an assistant turn (masked)."""
    pad_token_id: int
    """The id SFTDataset pads rows with."""
    custom_chat_template: str | None
    """The Jinja template (None: the tokenizer's own)."""
    has_bos: bool
    """Whether the tokenizer has a BOS token."""
    has_system_role: bool
    """Whether the template renders system turns (a leading one is dropped otherwise)."""
    force_system_message: bool = False
    system_default: dict | None = None


def _import_transformers():
    try:
        import transformers
    except ImportError:
        raise ImportError(
            "SFTTokenizer renders chat templates through transformers: pip install 'gigatron[hf]'"
        ) from None
    return transformers


class SFTTokenizer:
    """A local Hugging Face tokenizer (a directory `AutoTokenizer` reads offline) and one of
    PROMPT_FORMATS. `vocab_size` is `len(tokenizer)` (added tokens included)."""

    def __init__(self, tokenizer_path: str, prompt_format: str) -> None:
        if prompt_format not in PROMPT_FORMATS:
            raise ValueError(
                f"sft_tokenizer_prompt_format {prompt_format!r} is not one of {PROMPT_FORMATS}"
            )
        transformers = _import_transformers()
        tok = transformers.AutoTokenizer.from_pretrained(tokenizer_path, local_files_only=True)
        self._tokenizer = tok
        self._vocab_size = len(tok)
        self._prompt_format = prompt_format

        def special(name: str) -> int:
            token_id = tok.convert_tokens_to_ids(name)
            if token_id is None or token_id == tok.unk_token_id and name != tok.unk_token:
                raise ValueError(
                    f"sft_tokenizer_prompt_format {prompt_format!r} needs the token {name!r}, "
                    f"which the tokenizer at {tokenizer_path} does not have"
                )
            return token_id

        if prompt_format == "default":
            if not tok.chat_template:
                raise ValueError(
                    f"sft_tokenizer_prompt_format 'default' uses the tokenizer's chat template; "
                    f"the tokenizer at {tokenizer_path} has none"
                )
            pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
            cfg = PromptConfig(0, pad, None, tok.bos_token_id is not None, True)
        elif prompt_format == "identity":
            cfg = PromptConfig(0, special("<unk>"), _IDENTITY, False, True)
        elif prompt_format == "nemotron-h-aligned":
            cfg = PromptConfig(0, special("<SPECIAL_233>"), _NEMOTRON_H_ALIGNED, False, True)
        else:
            cfg = PromptConfig(3, special("<unk>"), _NEMOTRON_NANO_V2, False, True)
        if cfg.pad_token_id is None:
            raise ValueError(
                f"SFTTokenizer: the tokenizer at {tokenizer_path} has neither a pad nor an eos "
                "token to pad rows with"
            )
        self._prompt_config = cfg
        self.unique_identifiers: OrderedDict = OrderedDict(
            [("class", "SFTTokenizer"), ("tokenizer_path", [str(tokenizer_path)]),
             ("prompt_format", prompt_format)]
        )  # fmt: skip

    # ---- the conversation -> (ids, targets) core

    def _ids(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        """The template's text for `messages`, tokenized without extra special tokens (as
        apply_chat_template(tokenize=True) does)."""
        text = self._tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            chat_template=self._prompt_config.custom_chat_template,
        )
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def tokenize_conversation(
        self, conversation: list[dict], return_target: bool, add_generation_prompt: bool
    ):
        """[{"role", "content"}, ...] -> ids int64 [n] (and targets int64 [n]: the ids on
        assistant answers, IGNORE_INDEX elsewhere) when `return_target`."""
        if not self._prompt_config.has_system_role and conversation[0]["role"] == "system":
            conversation = conversation[1:]
        ids = self._ids(conversation, add_generation_prompt)
        tokens = numpy.array(ids, dtype=numpy.int64)
        if not return_target:
            return tokens
        target = numpy.full_like(tokens, IGNORE_INDEX)
        for i, turn in enumerate(conversation):
            role = str(turn.get("role", "")).lower()
            if role not in ("system", "user", "assistant", "tool"):
                raise ValueError(f"SFTTokenizer: turn {i} has role {turn.get('role')!r}; "
                                 "one of system, user, assistant, tool")  # fmt: skip
            if role != "assistant":
                continue
            if not turn.get("content"):
                raise ValueError(f"SFTTokenizer: turn {i} is an empty assistant turn")
            if i == 0 or str(conversation[i - 1]["role"]).lower() not in ("user", "tool"):
                raise ValueError(
                    f"SFTTokenizer: assistant turn {i} must follow a user or tool turn"
                )
            start = len(self._ids(conversation[:i], add_generation_prompt=True))
            through = self._ids(conversation[: i + 1], add_generation_prompt=False)
            end = len(through)
            if through != ids[:end] or start > end:
                raise ValueError(
                    f"SFTTokenizer: the chat template is not prefix-stable at turn {i}: the "
                    "tokens of the conversation up to it do not start the whole conversation's "
                    "tokens, so its answer tokens cannot be located"
                )
            start += self._prompt_config.assistant_prefix_len
            target[start:end] = tokens[start:end]
        return tokens, target

    # ---- what the training code asks of a tokenizer

    def tokenize(self, text: str) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def detokenize(self, ids: Any) -> str:
        return self._tokenizer.decode(list(ids))

    def text_to_ids(self, text: str | list[dict]) -> list[int]:
        """A string, or a conversation rendered with the generation prompt (for inference)."""
        if isinstance(text, list):
            return self.tokenize_conversation(
                text, return_target=False, add_generation_prompt=True
            ).tolist()
        return self.tokenize(text)

    def ids_to_text(self, ids: list[int]) -> str:
        return self.detokenize(ids)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def vocab(self) -> dict:
        return self._tokenizer.get_vocab()

    @property
    def inv_vocab(self) -> dict:
        return {v: k for k, v in self.vocab.items()}

    @property
    def pad(self) -> int:
        return self._prompt_config.pad_token_id

    pad_id = pad

    @property
    def bos(self) -> int | None:
        return self._tokenizer.bos_token_id

    bos_id = bos

    @property
    def eod(self) -> int | None:
        return self._tokenizer.eos_token_id

    eos = eod
