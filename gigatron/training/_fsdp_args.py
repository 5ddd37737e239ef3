"""Validation of the fully-sharded-data-parallel flags (`--use-megatron-fsdp`,
`--use-torch-fsdp2`), with Megatron's rules and gigatron's limits, each a one-line ValueError
before any process group starts. Called by `arguments.validate_args`."""

from __future__ import annotations

import torch

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "auto": None}


def _dtype(value):
    return value if value is None or isinstance(value, torch.dtype) else _DTYPES[value]


def check_fsdp_args(args) -> None:
    """Map Megatron-FSDP's dtype flags to torch dtypes and refuse what FSDP cannot run."""
    for name in (
        "megatron_fsdp_main_params_dtype",
        "megatron_fsdp_main_grads_dtype",
        "megatron_fsdp_grad_comm_dtype",
    ):
        setattr(args, name, _dtype(getattr(args, name)))
    if args.megatron_fsdp_main_params_dtype not in (None, torch.float32):
        raise ValueError(
            "--megatron-fsdp-main-params-dtype must be fp32 in gigatron (the sharded params "
            "are the fp32 main params)"
        )
    for name in ("megatron_fsdp_main_grads_dtype", "megatron_fsdp_grad_comm_dtype"):
        if getattr(args, name) is torch.float16:
            raise ValueError(f"--{name.replace('_', '-')} fp16 is not supported (fp32 or bf16)")
    args.megatron_fsdp_main_params_dtype = torch.float32  # "auto": the fp32 model params
    check_fsdp_ckpt_format(args)
    mfsdp, tfsdp = args.use_megatron_fsdp, args.use_torch_fsdp2
    if mfsdp and tfsdp:
        raise ValueError("--use-megatron-fsdp and --use-torch-fsdp2 are mutually exclusive")
    if not (mfsdp or tfsdp):
        return
    flag = "--use-megatron-fsdp" if mfsdp else "--use-torch-fsdp2"
    rules = (
        (args.pipeline_model_parallel_size > 1,
         f"--pipeline-model-parallel-size {args.pipeline_model_parallel_size}: pipeline "
         "parallelism is not supported"),
        (args.expert_model_parallel_size > 1,
         f"--expert-model-parallel-size {args.expert_model_parallel_size}: expert parallelism "
         "is not supported"),
        (args.fp16, "--fp16 is not supported (use --bf16)"),
        (args.optimizer not in ("adam", "sgd"),
         f"--optimizer {args.optimizer} is not supported (adam or sgd)"),
    )  # fmt: skip
    for broken, why in rules:
        if broken:
            raise ValueError(f"{flag}: {why}")
    if tfsdp:
        _check_torch_fsdp2(args)
        return
    args.use_custom_fsdp = True  # Megatron's deprecated alias follows
    args.use_distributed_optimizer = True  # Megatron-FSDP v1 steps through the dist. optimizer
    if args.ckpt_format != "fsdp_dtensor":
        raise ValueError(
            f"--use-megatron-fsdp requires --ckpt-format fsdp_dtensor (got {args.ckpt_format}; "
            "Megatron's rule)"
        )


def _check_torch_fsdp2(args) -> None:
    if args.use_distributed_optimizer:
        raise ValueError(
            "--use-torch-fsdp2 is not supported with --use-distributed-optimizer (Megatron's "
            "rule: FSDP2 shards the optimizer itself)"
        )
    if args.ckpt_format not in ("torch_dist", "torch_dcp"):
        raise ValueError(
            f"--use-torch-fsdp2 requires --ckpt-format torch_dist or torch_dcp (got "
            f"{args.ckpt_format})"
        )
    if not args.untie_embeddings_and_output_weights:
        raise ValueError(
            "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights (Megatron's rule)"
        )


def check_fsdp_ckpt_format(args) -> None:
    """`--ckpt-format fsdp_dtensor` is Megatron-FSDP's, `torch_dcp` FSDP2's (Megatron's rules)."""
    if args.ckpt_format == "fsdp_dtensor" and not args.use_megatron_fsdp:
        raise ValueError("--ckpt-format fsdp_dtensor needs --use-megatron-fsdp (Megatron's rule)")
    if args.ckpt_format == "torch_dcp" and not args.use_torch_fsdp2:
        raise ValueError("--ckpt-format torch_dcp needs --use-torch-fsdp2 (Megatron's rule)")
