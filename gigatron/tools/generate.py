"""`gigatron generate --load CKPT --prompt TEXT ...`: text from a training checkpoint.

Plays the part of Megatron's `tools/run_text_generation_server.py` / `text_generation_cli.py`
with `--use-checkpoint-args` always on: the model shape and tokenizer come from the args saved
in the checkpoint (flags given on the command line win), so `--load DIR --prompt ...` is
enough; that holds for a checkpoint written by `gigatron convert` (its tokenizer files sit next
to it) and for a Hugging Face directory (`--load HF_DIR`: config.json, tokenizer.json, weights
read straight from its safetensors). Launch under `torchrun --nproc-per-node=N` for tensor
parallelism; the TP size is `--tensor-model-parallel-size`, else the checkpoint's when it
divides the world size, else 1 (checkpoints reshard to any TP). Pipeline parallelism is not
supported (PP = 1).

Sampling: `--greedy` (top-k 1), `--temperature`, `--top-k`, `--top-p`, `--seed`,
`--max-new-tokens`; generation of a prompt stops at the tokenizer's end-of-document id.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial

import torch.distributed as dist

from gigatron.convert import is_hf_dir, load_hf_into_model
from gigatron.core.dist_checkpointing import checkpoint_files as ckpt_files
from gigatron.core.inference import GenerationResult, SamplingParams, generate
from gigatron.training.arguments import build_parser, parse_args
from gigatron.training.checkpoint_args import (
    apply_checkpoint_model_args,
    command_line_dests,
    saved_args,
)
from gigatron.training.checkpointing import load_checkpoint
from gigatron.training.global_vars import get_tokenizer
from gigatron.training.gpt_builders import gpt_builder
from gigatron.training.initialize import destroy_distributed, initialize_megatron
from gigatron.training.model_provider import model_provider
from gigatron.training.training import get_model
from gigatron.training.utils import args_by_name

_FILE = "gigatron/tools/generate.py"
# Checkpoint args taken over unless the command line sets them (besides the "model" group).
_CKPT_KEYS = (
    "tokenizer_type",
    "vocab_file",
    "merge_file",
    "tokenizer_model",
    "vocab_size",
    "bf16",
    "fp16",
)


def add_text_generation_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    g = parser.add_argument_group("text generation")
    g.add_argument("--prompt", action="append", default=None, help="prompt text (repeatable)")
    g.add_argument("--max-new-tokens", type=int, default=30, help="new tokens per prompt")
    g.add_argument("--temperature", type=float, default=1.0, help="divide logits by this")
    g.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest (0: off)")
    g.add_argument("--top-p", type=float, default=0.0, help="nucleus sampling mass (0: off)")
    g.add_argument("--greedy", action="store_true", help="argmax decoding (same as --top-k 1)")
    g.add_argument("--return-log-probs", action="store_true", help="print token log probs")
    g.add_argument(
        "--use-checkpoint-args", action="store_true", help="Megatron's flag; always on here"
    )
    return parser


def _checkpoint_args(load: str):
    """The args Namespace saved in the tracked checkpoint under `load`."""
    if ckpt_files.tracked_dir(load) is None:
        raise ValueError(
            f"--load ({load}) has no {ckpt_files.TRACKER_FNAME} and is no Hugging Face directory "
            "(config.json + *.safetensors): not a checkpoint"
        )
    return saved_args(load)


def _merge_checkpoint_args(parser, args, given: set[str], ckpt) -> None:
    model_dests = {
        a.dest for grp in parser._action_groups if grp.title == "model" for a in grp._group_actions
    }
    for key in model_dests | set(_CKPT_KEYS):
        if key not in given and hasattr(ckpt, key):
            setattr(args, key, getattr(ckpt, key))


def _choose_layout(args, given: set[str], ckpt, world_size: int) -> None:
    """TP from the flag or the checkpoint; everything else at 1 (generation runs TP only)."""
    if "pipeline_model_parallel_size" in given and args.pipeline_model_parallel_size > 1:
        raise ValueError(
            f"--pipeline-model-parallel-size ({args.pipeline_model_parallel_size}) > 1 is not "
            f"supported by gigatron generate (PP = 1; checkpoints reshard) ({_FILE})"
        )
    if "tensor_model_parallel_size" not in given and ckpt is not None:
        tp = getattr(ckpt, "tensor_model_parallel_size", 1)
        if world_size % tp:
            print(f"note: checkpoint TP {tp} does not divide world size {world_size}; using TP=1")
            tp = 1
        args.tensor_model_parallel_size = tp
    args.pipeline_model_parallel_size = 1
    args.virtual_pipeline_model_parallel_size = None
    args.num_layers_per_virtual_pipeline_stage = None
    args.context_parallel_size = 1
    args.expert_model_parallel_size = 1
    args.expert_tensor_parallel_size = None
    args.sequence_parallel = False  # one decoded token cannot be split over TP ranks
    # Training-only flags validate_args insists on; unused here.
    args.micro_batch_size = args.micro_batch_size or 1
    if args.train_iters is None and args.train_samples is None:
        args.train_iters = 1
    args.lr = 0.0 if args.lr is None else args.lr
    args.mock_data = args.mock_data or not args.data_path
    args.hidden_dropout = args.attention_dropout = 0.0


def _sampling_params(args) -> SamplingParams:
    return SamplingParams(
        top_k=1 if args.greedy else args.top_k,
        top_p=0.0 if args.greedy else args.top_p,
        num_tokens_to_generate=args.max_new_tokens,
        **args_by_name(args, "temperature return_log_probs"),
    )


def _load_model(args):
    model = get_model(partial(model_provider, gpt_builder), wrap_with_ddp=False)
    if is_hf_dir(args.load):
        load_hf_into_model(model, args.load)
    elif args.load:
        load_args = argparse.Namespace(
            **args_by_name(args, "load"), no_load_optim=True, no_load_rng=True, finetune=False
        )
        load_checkpoint(model, None, None, args=load_args)
    return model[0].eval()


def load_model(argv: list[str], *, need_prompt: bool = False):
    """Parse generation flags, take the model and tokenizer args from `--load`, set up TP and
    load the weights: (model in eval mode, args). Call it on every rank."""
    parser = build_parser(add_text_generation_args)
    args = parse_args(add_text_generation_args, argv=argv)
    if need_prompt and not args.prompt:
        raise ValueError("give at least one --prompt TEXT")
    given = command_line_dests(parser, argv, args.yaml_cfg)
    ckpt = _checkpoint_args(args.load) if args.load and not is_hf_dir(args.load) else None
    if ckpt is not None:
        _merge_checkpoint_args(parser, args, given, ckpt)
    # a converted checkpoint / HF directory: tokenizer paths relative to it, HF config fields
    apply_checkpoint_model_args(args, given)
    _choose_layout(args, given, ckpt, int(os.environ.get("WORLD_SIZE", "1")))
    initialize_megatron(parsed_args=args)
    padded = getattr(ckpt, "padded_vocab_size", None)
    if padded is not None:  # the saved embedding's rows, whatever TP padding gives now
        if padded % args.tensor_model_parallel_size:
            raise ValueError(
                f"checkpoint padded_vocab_size ({padded}) must be divisible by "
                f"--tensor-model-parallel-size ({args.tensor_model_parallel_size}) ({_FILE})"
            )
        args.padded_vocab_size = padded
    return _load_model(args), args


def run(argv: list[str] | None = None) -> list[GenerationResult]:
    """Parse flags, set up TP, load the checkpoint and generate; returns one result a prompt."""
    argv = list(sys.argv[1:] if argv is None else argv)
    model, args = load_model(argv, need_prompt=True)
    start = time.perf_counter()
    results = generate(
        model, get_tokenizer(), args.prompt, _sampling_params(args), random_seed=args.seed
    )
    _report(results, args, time.perf_counter() - start)
    return results


def _report(results: list[GenerationResult], args, seconds: float) -> None:
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    for i, r in enumerate(results):
        end = "end-of-document" if r.stopped_on_termination else "token limit"
        print(f"----- prompt {i} ({len(r.generated_tokens)} new tokens, stopped at {end}) -----")
        print(r.text, flush=True)
        if r.generated_log_probs is not None:
            print("log probs:", " ".join(f"{p:.3f}" for p in r.generated_log_probs))
    total = sum(len(r.generated_tokens) for r in results)
    print(
        f"generated {total} tokens for {len(results)} prompt(s) in {seconds:.2f} s "
        f"({total / max(seconds, 1e-9):.1f} tokens/s, TP={args.tensor_model_parallel_size})",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    run(argv)
    # a clean exit: the gloo group torn down at interpreter shutdown could abort a finished run
    # ("terminate called without an active exception": make train's demo, once in four)
    destroy_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
