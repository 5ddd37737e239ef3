"""Per-request sampling settings.

Mirrors `megatron.core.inference.sampling_params.SamplingParams` (field names and defaults of
megatron-core 0.20, `streaming_interval` included; `num_tokens_to_generate` None means up to the
model's max_sequence_length, as in 0.19's engine; 0.16's default was 30). Megatron's rules are
kept: `top_k == 1` is greedy decoding, `top_k > 0` and `top_p > 0` together are an error,
`termination_id` None means the tokenizer's end-of-document id. Fields gigatron does not
implement (`top_n_logprobs`, `stop_words`, `return_segments`, `skip_prompt_log_probs`,
`streaming`, `do_kv_handoff`) raise ValueError when set to a non-default value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["SamplingParams"]

_FILE = "gigatron/core/inference/sampling_params.py"


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop."""

    temperature: float = 1.0
    """Logits are divided by this before top-k / top-p filtering (must be > 0)."""
    top_k: int = 0
    """Keep the k most likely tokens (0: off; 1: greedy argmax)."""
    top_p: float = 0.0
    """Keep the smallest set of tokens whose probabilities sum to >= top_p (0: off)."""
    return_log_probs: bool = False
    """Return log p(token) of each generated token (from the unscaled logits)."""
    skip_prompt_log_probs: bool = False
    """Megatron field; gigatron returns generated-token log probs only."""
    return_segments: bool = False
    """Megatron field (per-token detokenized pieces); not supported."""
    num_tokens_to_generate: int | None = None
    """New tokens per prompt (at most; generation stops early at termination_id). None: up to
    the model's max_sequence_length (prompt included)."""
    num_tokens_total: int | None = None
    """Prompt + new tokens per prompt, instead of num_tokens_to_generate."""
    termination_id: int | None = None
    """Stop a prompt when this id is sampled (None: the tokenizer's eod)."""
    top_n_logprobs: int = 0
    """Megatron field; not supported."""
    return_prompt_top_n_logprobs: bool = False
    """Megatron field (deprecated there); not supported."""
    add_BOS: bool = False
    """Prepend the tokenizer's BOS id to each prompt."""
    stop_words: list[str] | None = None
    """Megatron field; not supported."""
    detokenize_stop_sequence: bool = False
    """Keep the termination token in `generated_text` (Megatron: stop words and EOD)."""
    return_prompt_tokens: bool = False
    """Megatron's engine drops prompt ids from serialized responses unless set; gigatron's
    results are in-process and always carry `prompt_tokens`, so either value is accepted."""
    streaming: bool = False
    """Megatron's engine emits partial replies; gigatron's generate returns whole results, so
    only False is accepted."""
    streaming_interval: int = 1
    """Minimum unsent tokens per partial reply (Megatron 0.20): an int >= 1; inert without
    streaming."""
    do_kv_handoff: bool = False
    """Megatron's KV-block handoff to a peer engine; not supported."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the field, its value and the rule."""
        if not self.temperature > 0.0:
            raise ValueError(f"temperature ({self.temperature}) must be > 0 ({_FILE})")
        if self.top_k < 0:
            raise ValueError(f"top_k ({self.top_k}) must be >= 0 ({_FILE})")
        if not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"top_p ({self.top_p}) must be in [0, 1] ({_FILE})")
        if self.top_k > 0 and self.top_p > 0.0:
            raise ValueError(
                f"top_k ({self.top_k}) and top_p ({self.top_p}) cannot both be > 0 "
                f"(Megatron's rule) ({_FILE})"
            )
        if self.num_tokens_total is not None and self.num_tokens_total < 1:
            raise ValueError(f"num_tokens_total ({self.num_tokens_total}) must be >= 1 ({_FILE})")
        if self.num_tokens_to_generate is not None and self.num_tokens_total is not None:
            raise ValueError(
                f"num_tokens_to_generate ({self.num_tokens_to_generate}) and num_tokens_total "
                f"({self.num_tokens_total}) cannot both be set (Megatron's rule) ({_FILE})"
            )
        if self.num_tokens_to_generate is not None and self.num_tokens_to_generate < 0:
            raise ValueError(
                f"num_tokens_to_generate ({self.num_tokens_to_generate}) must be >= 0 ({_FILE})"
            )
        interval = self.streaming_interval
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(
                f"streaming_interval ({interval!r}) must be an integer greater than or equal to 1 "
                f"({_FILE})"
            )
        unsupported = (
            "top_n_logprobs",
            "stop_words",
            "return_segments",
            "skip_prompt_log_probs",
            "streaming",
            "do_kv_handoff",
        )
        for name in unsupported:
            default = {f.name: f.default for f in dataclasses.fields(self)}[name]
            if getattr(self, name) != default:
                raise ValueError(
                    f"{name} ({getattr(self, name)!r}) is not supported by gigatron ({_FILE})"
                )

    @property
    def greedy(self) -> bool:
        return self.top_k == 1

    def add_attributes(self, attribute_value_pair: dict) -> None:
        """Set several fields at once (Megatron's helper), then re-validate."""
        for key, value in attribute_value_pair.items():
            setattr(self, key, value)
        self.validate()

    def serialize(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def deserialize(cls, data: dict) -> SamplingParams:
        """The SamplingParams `serialize` returned (validated)."""
        return cls(**data)
