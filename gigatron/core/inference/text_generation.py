"""`generate(model, tokenizer, prompts, ...)`: batched text generation with a static KV cache.

Plays the part of Megatron's static engine + `TextGenerationController` + `GPTInferenceWrapper`
(`megatron.core.inference`), in one small loop: prompts of different lengths share a batch;
the common prefix is prefilled in one forward, then one position per step is decoded for every
row (a row still inside its prompt keeps its prompt token, as Megatron does). Logits are
gathered over TP, the token is sampled on TP rank 0 and broadcast, so every TP rank feeds the
same token to the next step. Pipeline parallelism is not supported (PP = 1 only).

Shapes: b: prompts, t: positions so far, V: padded vocabulary (V/tp on one rank).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.inference.contexts import StaticInferenceContext
from gigatron.core.inference.sampling import sample
from gigatron.core.inference.sampling_params import SamplingParams

__all__ = ["GenerationResult", "generate"]

_FILE = "gigatron/core/inference/text_generation.py"


@dataclass
class GenerationResult:
    """One prompt's output (the fields of Megatron's InferenceRequest that apply here)."""

    prompt: str | None
    prompt_tokens: list[int]
    generated_tokens: list[int] = field(default_factory=list)
    """New token ids; ends with termination_id when generation stopped on it."""
    generated_text: str | None = None
    """Detokenized generated_tokens, without the termination id unless
    `detokenize_stop_sequence` (None without a tokenizer)."""
    generated_log_probs: list[float] | None = None
    stopped_on_termination: bool = False

    @property
    def tokens(self) -> list[int]:
        return self.prompt_tokens + self.generated_tokens

    @property
    def text(self) -> str | None:
        if self.prompt is None or self.generated_text is None:
            return None
        return self.prompt + self.generated_text


def _unwrap(model):
    while hasattr(model, "module") and not hasattr(model, "decoder"):
        model = model.module  # DDP / Float16Module wrappers
    return model


def _check_layout(core) -> None:
    if parallel_state.model_parallel_is_initialized():
        pp = parallel_state.get_pipeline_model_parallel_world_size()
        if pp > 1:
            raise ValueError(
                f"pipeline_model_parallel_size ({pp}) > 1 is not supported by gigatron's "
                f"generate; load the checkpoint with PP = 1 (checkpoints reshard) ({_FILE})"
            )
    if core.config.sequence_parallel:
        raise ValueError(
            f"sequence_parallel (True) must be off for generation: build the model with "
            f"sequence_parallel=False ({_FILE})"
        )


def _tp_group_and_size():
    if not parallel_state.model_parallel_is_initialized():
        return None, 1
    return (
        parallel_state.get_tensor_model_parallel_group(),
        parallel_state.get_tensor_model_parallel_world_size(),
    )


def _tokenize(tokenizer, prompts, params: SamplingParams) -> list[list[int]]:
    out = []
    for prompt in prompts:
        ids = list(prompt) if not isinstance(prompt, str) else None
        if ids is None:
            if tokenizer is None:
                raise ValueError(f"text prompts need a tokenizer (got tokenizer=None) ({_FILE})")
            ids = list(tokenizer.tokenize(prompt))
        if params.add_BOS:
            ids = [tokenizer.bos] + ids
        if not ids:
            raise ValueError(f"prompt {prompt!r} has no tokens ({_FILE})")
        out.append([int(i) for i in ids])
    return out


def _last_logits(core, logits, tp_group, tp_size):
    """This step's last-position logits [b, V], gathered over TP when the model keeps V/tp."""

    last = logits[:, -1, :]  # [b, V/tp]
    if tp_size > 1 and core.parallel_output:
        last = tensor_parallel.gather_from_tensor_model_parallel_region(last, group=tp_group)
    return last.float()  # [b, V]


def _agree_on_token(token, tp_group, tp_size):
    """All TP ranks take TP rank 0's sample (random draws may differ across ranks)."""
    if tp_size > 1:
        src = parallel_state.get_tensor_model_parallel_src_rank()
        dist.broadcast(token, src=src, group=tp_group)
    return token


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list,
    sampling_params: SamplingParams | None = None,
    *,
    random_seed: int | None = None,
    inference_config=None,
    **overrides,
) -> list[GenerationResult]:
    """Generate continuations of `prompts` (strings, or lists of token ids).

    `sampling_params` fields may also be given as keywords (`top_k=1`, `temperature=0.7`,
    `num_tokens_to_generate=20`, ...). `random_seed` seeds the sampler (same seed, same
    text at any TP size). Returns one GenerationResult per prompt, in order. Call it on every
    rank of the model-parallel group. `inference_config` (Megatron's InferenceConfig) runs the
    prompts in batches of at most `max_requests` and refuses sequences longer than its
    `max_sequence_length`.
    """
    batch = inference_config.max_requests if inference_config is not None else None
    if batch is not None and len(prompts) > batch:
        kwargs = dict(random_seed=random_seed, inference_config=inference_config, **overrides)
        return [
            result
            for i in range(0, len(prompts), batch)
            for result in generate(
                model, tokenizer, prompts[i : i + batch], sampling_params, **kwargs
            )  # fmt: skip
        ]
    params = sampling_params or SamplingParams()
    params = dataclasses.replace(params, **overrides) if overrides else params
    core = _unwrap(model)
    _check_layout(core)
    tp_group, tp_size = _tp_group_and_size()
    prompt_ids = _tokenize(tokenizer, prompts, params)
    termination_id = params.termination_id
    if termination_id is None and tokenizer is not None:
        termination_id = getattr(tokenizer, "eod", None)
    vocab_size = tokenizer.vocab_size if tokenizer is not None else None

    lengths = [len(ids) for ids in prompt_ids]
    max_positions = getattr(core, "max_sequence_length", None)
    if params.num_tokens_total is not None:
        budgets = [max(0, params.num_tokens_total - n) for n in lengths]
    elif params.num_tokens_to_generate is not None:
        budgets = [params.num_tokens_to_generate] * len(lengths)
    elif max_positions is None:
        raise ValueError(
            "num_tokens_to_generate=None (up to max_sequence_length) needs a model with "
            f"max_sequence_length; set num_tokens_to_generate ({_FILE})"
        )
    else:  # megatron-core 0.19's engine: fill the context up to max_sequence_length
        budgets = [max(0, max_positions - n) for n in lengths]
    total = max(n + k for n, k in zip(lengths, budgets))
    max_positions = total if max_positions is None else max_positions
    if inference_config is not None and total > inference_config.max_sequence_length:
        raise ValueError(
            f"prompt + new tokens ({total}) exceeds InferenceConfig.max_sequence_length "
            f"({inference_config.max_sequence_length}) ({_FILE})"
        )
    if core.position_embedding_type == "learned_absolute" and total > max_positions:
        raise ValueError(
            f"prompt + new tokens ({total}) exceeds the model's max_sequence_length "
            f"({max_positions}) for learned position embeddings ({_FILE})"
        )

    device = next(core.parameters()).device
    b = len(prompt_ids)
    tokens = torch.zeros(b, total, dtype=torch.long, device=device)  # [b, total]
    for i, ids in enumerate(prompt_ids):
        tokens[i, : len(ids)] = torch.tensor(ids, device=device)
    generator = None
    if random_seed is not None:
        generator = torch.Generator(device=device).manual_seed(random_seed)
    results = [
        GenerationResult(
            prompt=p if isinstance(p, str) else None,
            prompt_tokens=ids,
            generated_log_probs=[] if params.return_log_probs else None,
        )
        for p, ids in zip(prompts, prompt_ids)
    ]
    done = [k == 0 for k in budgets]
    context = StaticInferenceContext(b, total)
    was_training = core.training
    model.eval()
    try:
        start, end = 0, min(lengths)
        while end <= total and not all(done):
            logits = model(tokens[:, start:end], None, None, inference_context=context)
            context.increment_sequence_len_offset(end - start)
            context.enable_decode_mode()
            last = _last_logits(core, logits, tp_group, tp_size)  # [b, V]
            token = sample(
                last, params.temperature, params.top_k, params.top_p, vocab_size, generator
            )
            token = _agree_on_token(token, tp_group, tp_size)  # [b]
            log_probs = None
            if params.return_log_probs:
                masked = last if vocab_size is None else last[:, :vocab_size]
                log_probs = torch.log_softmax(masked, dim=-1)  # [b, V]
            _record(results, done, token, log_probs, lengths, budgets, end, termination_id)
            if end < total:
                prompt_rows = torch.tensor([end < n for n in lengths], device=device)
                tokens[:, end] = torch.where(prompt_rows, tokens[:, end], token)
            start, end = end, end + 1
    finally:
        model.train(was_training)
    for r in results:
        drop_stop = r.stopped_on_termination and not params.detokenize_stop_sequence
        kept = r.generated_tokens[:-1] if drop_stop else r.generated_tokens
        if tokenizer is not None:
            r.generated_text = tokenizer.detokenize(kept)
    return results


def _record(results, done, token, log_probs, lengths, budgets, end, termination_id) -> None:
    """Append the token sampled for position `end` to rows whose prompt ended before it."""
    ids = token.tolist()
    for i, r in enumerate(results):
        if done[i] or end < lengths[i]:
            continue
        r.generated_tokens.append(ids[i])
        if log_probs is not None:
            r.generated_log_probs.append(float(log_probs[i, ids[i]]))
        if termination_id is not None and ids[i] == termination_id:
            r.stopped_on_termination = True
        done[i] = r.stopped_on_termination or len(r.generated_tokens) >= budgets[i]
