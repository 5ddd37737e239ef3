"""Request objects of Megatron's inference API (`megatron.core.inference.inference_request`).

`InferenceRequest` is what Megatron's engines return per prompt: the prompt, its sampling
parameters, status, generated tokens / text / log probs. gigatron's `generate` (static batching,
in-process) returns `GenerationResult`s; `InferenceRequest.from_generation_result` turns one
into Megatron's object, and `serialize` / `deserialize` round-trip it as plain lists and dicts
(tensors as lists, as Megatron's wire format). The dynamic engine's requests and events
(`DynamicInferenceRequest`, prefix caching, KV handoff) have no counterpart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from gigatron.core.inference.sampling_params import SamplingParams
from gigatron.core.inference.text_generation import GenerationResult

__all__ = ["InferenceRequest", "Status", "deserialize_tensor", "serialize_tensor"]


def serialize_tensor(tensor: torch.Tensor) -> list:
    """A tensor as nested lists (on the CPU)."""
    return tensor.cpu().tolist()


def deserialize_tensor(tensor_as_list: list) -> torch.Tensor:
    return torch.tensor(tensor_as_list)


class Status(Enum):
    WAITING_IN_QUEUE = 1
    ACTIVE_AND_GENERATING_TOKENS = 2
    ACTIVE_BUT_NOT_GENERATING_TOKENS = 3
    COMPLETED = 4
    FAILED = 5


@dataclass(kw_only=True)
class InferenceRequest:
    """One prompt's request and result (Megatron's field names)."""

    request_id: int
    prompt: str | None
    sampling_params: SamplingParams | None = None
    inference_parameters: SamplingParams | None = None  # Megatron's old name, folded in
    prompt_tokens: list[int] | None = None
    prompt_length: int | None = None
    arrival_time: float | None = None
    status: Status | None = None
    encoder_prompt: str | None = None
    generated_text: str | None = None
    segments: list[str] | None = None
    generated_segments: list[str] | None = None
    generated_sequence_lengths: list[int] | None = None
    generated_tokens: Any = None
    prompt_log_probs: Any = None
    generated_log_probs: Any = None
    prompt_top_n_logprobs: list[dict[str, float]] | None = None
    generated_top_n_logprobs: list[dict[str, float]] | None = None
    generated_length: int | None = None
    tpot: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.sampling_params is None and self.inference_parameters is not None:
            self.sampling_params = self.inference_parameters

    @classmethod
    def from_generation_result(
        cls, request_id: int, result: GenerationResult, sampling_params: SamplingParams | None
    ) -> InferenceRequest:
        """Megatron's completed request for one of `generate`'s results."""
        return cls(
            request_id=request_id,
            prompt=result.prompt,
            sampling_params=sampling_params,
            prompt_tokens=list(result.prompt_tokens),
            prompt_length=len(result.prompt_tokens),
            status=Status.COMPLETED,
            generated_text=result.generated_text,
            generated_tokens=list(result.generated_tokens),
            generated_log_probs=result.generated_log_probs,
            generated_length=len(result.generated_tokens),
            generated_sequence_lengths=[len(result.generated_tokens)],
        )

    def serialize(self) -> dict:
        """Plain data: status by name, sampling params as dicts, tensors as ("tensor", list)."""
        obj = self.__dict__.copy()
        obj["status"] = self.status.name if self.status else None
        for name in ("sampling_params", "inference_parameters"):
            obj[name] = obj[name].serialize() if obj[name] is not None else None
        return {
            k: ("tensor", serialize_tensor(v)) if isinstance(v, torch.Tensor) else v
            for k, v in obj.items()
        }

    @classmethod
    def deserialize(cls, obj: dict) -> InferenceRequest:
        data = dict(obj)
        data["status"] = None if obj["status"] is None else Status[obj["status"]]
        for name in ("sampling_params", "inference_parameters"):
            if data.get(name) is not None:
                data[name] = SamplingParams.deserialize(data[name])
        for k, v in obj.items():
            if isinstance(v, (list, tuple)) and len(v) == 2 and v[0] == "tensor":
                data[k] = deserialize_tensor(v[1])
        return cls(**data)
