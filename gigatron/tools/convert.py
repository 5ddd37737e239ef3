"""`gigatron convert`: Hugging Face <-> gigatron checkpoints (safetensors <-> torch_dist).

    gigatron convert hf-to-gigatron --load HF_DIR --save OUT \
        [--target-tensor-parallel-size 2] [--target-pipeline-parallel-size 2]
    gigatron convert gigatron-to-hf --load CKPT_DIR --save HF_OUT [--hf-config HF_DIR]
    gigatron convert --load X --save Y        # direction from X: config.json + safetensors = HF
    gigatron convert --list                   # the families (model_type) and what each supports

Megatron ships this as tools/checkpoint/convert.py (--loader/--saver plugins); the flag names
--load/--save and --target-*-parallel-size follow it. Runs in one process on CPU, streaming
tensor by tensor. See docs/convert.md.
"""

from __future__ import annotations

import argparse
import os
import sys

from gigatron.convert.hf_to_gigatron import FLAGS_FNAME

_DIRECTIONS = ("hf-to-gigatron", "gigatron-to-hf")
_TO_GIGATRON = """tensor_model_parallel_size pipeline_model_parallel_size expert_model_parallel_size
make_vocab_size_divisible_by"""


def _size(text: str) -> int:
    """'5GB', '500MB', '20KB' or a byte count."""
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
    t = text.strip().upper()
    for unit, scale in units.items():
        if t.endswith(unit):
            return int(float(t[: -len(unit)]) * scale)
    return int(t)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gigatron convert", description=__doc__.split("\n\n")[0])
    p.add_argument("direction", nargs="?", choices=_DIRECTIONS, help="default: from --load")
    p.add_argument("--list", action="store_true", help="print the families and exit")
    p.add_argument("--load", help="HF model directory or gigatron checkpoint")
    p.add_argument("--save", help="output directory")
    # dests are the converter's parameter names (Megatron's model-parallel flag names)
    p.add_argument(
        "--target-tensor-parallel-size",
        dest="tensor_model_parallel_size",
        metavar="N",
        type=int,
        default=1,
        help="TP the checkpoint is meant for (vocab padding, layout checks)",
    )
    p.add_argument(
        "--target-pipeline-parallel-size",
        dest="pipeline_model_parallel_size",
        metavar="N",
        type=int,
        default=1,
    )
    p.add_argument(
        "--target-expert-parallel-size",
        dest="expert_model_parallel_size",
        metavar="N",
        type=int,
        default=1,
    )
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    p.add_argument(
        "--hf-config",
        default=None,
        help="gigatron-to-hf: HF directory or config.json (default: next to --load)",
    )
    p.add_argument(
        "--max-shard-size",
        dest="max_shard_bytes",
        metavar="SIZE",
        type=_size,
        default=_size("5GB"),
        help="gigatron-to-hf: largest safetensors file, e.g. 5GB",
    )
    return p  # fmt: skip


def _hint(family: str, load: str, save: str) -> str:
    """What was written and the commands that use it (model flags come from the checkpoint)."""
    flags = os.path.join(save, FLAGS_FNAME)
    return "\n".join([
        f"converted {family} {load} -> {save} (torch_dist, release); the model and tokenizer "
        f"args are saved in the checkpoint (as flags: {flags})",
        f"generate:  gigatron generate --load {save} --prompt TEXT --greedy",
        f"fine-tune: gigatron train --load {save} --finetune --save DIR --data-path PREFIX "
        "--micro-batch-size N --global-batch-size N --train-iters N --lr LR",
        "export:    gigatron convert gigatron-to-hf --load DIR --save HF_OUT",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        from gigatron.convert.families import describe

        print(describe())
        return 0
    if not (args.load and args.save):
        parser.error("--load and --save are required (or --list)")
    from gigatron.convert import convert_gigatron_to_hf, convert_hf_to_gigatron, is_hf_dir
    from gigatron.training.utils import args_by_name

    direction = args.direction or ("hf-to-gigatron" if is_hf_dir(args.load) else "gigatron-to-hf")
    if direction == "hf-to-gigatron":
        spec = convert_hf_to_gigatron(args.load, args.save, **args_by_name(args, _TO_GIGATRON))
        print(_hint(spec.family, args.load, args.save))
    else:
        files = convert_gigatron_to_hf(
            args.load, args.save, **args_by_name(args, "hf_config max_shard_bytes")
        )
        print(f"exported {args.load} -> {args.save}: {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
