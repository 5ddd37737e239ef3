"""Megatron-LM flags that its example scripts pass and that gigatron honours, accepts or refuses.

Used by `gigatron.training.arguments` (mirrors parts of `megatron.training.arguments`:
`_add_regularization_args`, `_add_training_args`, `_add_logging_args`, `_add_checkpointing_args`,
`_add_moe_args`). Three kinds of flag live here (docs/training.md lists them all):

- real semantics: the weight-decay schedule, `--no-save-optim` / `--no-save-rng`,
  `--log-params-norm`, `--manual-gc*`, `--skip-train`, `--empty-unused-memory-level`,
  `--lr-warmup-init`, `--exit-on-missing-checkpoint`, the MoE capacity / layer-pattern flags,
  `--log-{validation-ppl,memory,world-size}-to-tensorboard`, `--no-log-loss-scale-to-tensorboard`;
- accepted no-ops: kernel-fusion toggles and timing / deprecated flags that cannot change the
  numbers gigatron computes (each is listed in `NO_OPS` with the reason);
- refused: values gigatron cannot honour (`--ckpt-format torch`, `--use-legacy-models`, ...),
  a ValueError naming the flag, raised by `validate_compat_args`.
"""

from __future__ import annotations

import ast
import os

import torch

from gigatron.core.transformer.enums import AttnBackend

# flag -> why accepting it changes nothing in gigatron (docs/training.md repeats these)
NO_OPS = {
    "--use-mcore-models": "deprecated in Megatron too: core models are the only models",
    "--no-masked-softmax-fusion": "no fused softmax kernel; the plain path computes the same",
    "--no-bias-gelu-fusion": "no fused bias+GeLU kernel; the plain path computes the same",
    "--no-bias-swiglu-fusion": "no fused bias+SwiGLU kernel; the plain path computes the same",
    "--no-bias-dropout-fusion": "no fused bias+dropout+add kernel; same numbers unfused",
    "--no-rope-fusion": "no fused RoPE kernel; the plain path computes the same",
    "--no-persist-layer-norm": "no persistent LayerNorm kernel (torch's LayerNorm is used)",
    "--attention-softmax-in-fp32": "gigatron's attention softmax is always fp32 "
    "(TransformerConfig.attention_softmax_in_fp32 defaults to True; SDPA kernels accumulate "
    "in fp32)",
    "--no-async-tensor-model-parallel-allreduce": "deprecated and ignored in Megatron too",
    "--use-cpu-initialization": "gigatron always initialises weights on CPU (TP-invariant init)",
    "--use-dist-ckpt": "deprecated in Megatron (see --ckpt-format); torch_dist is the format",
    "--no-ckpt-fully-parallel-save": "checkpoint write scheduling only; same files' content",
    "--ckpt-fully-parallel-load": "checkpoint read scheduling only",
    "--ckpt-assume-constant-structure": "a caching hint for repeated saves",
    "--timing-log-level": "gigatron has no per-operation timers (use --profile)",
    "--timing-log-option": "gigatron has no per-operation timers (use --profile)",
    "--no-barrier-with-level-1-timing": "gigatron has no per-operation timers",
    "--log-timers-to-tensorboard": "gigatron has no per-operation timers to write",
    "--tensorboard-log-interval": "scalars are written at every --log-interval",
    "--tensorboard-queue-size": "the writer flushes at every log line",
    "--wandb-entity": "W&B picks the entity from its own login",
    "--local-rank": "set by old launchers; gigatron reads LOCAL_RANK / RANK from the environment",
    "--no-overlap-p2p-communication": "pipeline send/recv scheduling only; same numbers",
    "--no-mmap-bin-files": "how the .bin files are read; the same tokens",
    "--num-dataset-builder-threads": "dataset index building is single-threaded; same indices",
    "--auto-detect-ckpt-format": "gigatron reads torch_dist only (a torch-format load fails "
    "with a message)",
    "--no-create-attention-mask-in-dataloader": "the attention is causal either way (refused "
    "with --reset-attention-mask, whose per-document mask Megatron would then drop)",
    "--moe-permute-fusion": "no fused permute kernel; the plain path computes the same",
    "--moe-router-fusion": "no fused router kernel; the plain path computes the same",
}

# Megatron flags that pick a backend gigatron does not have: accepted, and one line on rank 0
# says what runs instead (dest -> (flag as printed, what runs)). A flag set at its default says
# nothing.
BACKEND_ONLY = {
    "nccl_ub": (
        "--use-nccl-ub",
        "gradients and parameters are reduced / gathered from "
        "ordinary buffers (no NCCL user-buffer registration); same numbers",
    ),
    "fsdp_manual_registration": (
        "--fsdp-manual-registration",
        "no Megatron-FSDP buffers to register (Megatron uses it only with --use-megatron-fsdp)",
    ),
    "enable_experimental": (
        "--enable-experimental",
        "gigatron has no experimental-only code "
        "paths; every feature it implements runs without this switch",
    ),
    "export_force_local_attention": (
        "--export-force-local-attention",
        "a ModelOpt export switch; gigatron's attention is always its local one",
    ),
    "enable_gpt_oss": (
        "--enable-gpt-oss",
        "a ModelOpt export switch, unused by Megatron's "
        "training; the model is the one the other flags describe",
    ),
}

_MOE_FREQ_MAX_LAYERS = 100_000  # a pattern longer than any model is refused, not built


def moe_freq_type(value):
    """Megatron's --moe-layer-freq: an int N (an MoE layer every N layers) or a list pattern
    such as "([1]*3+[0]*1)*3" (1 = MoE layer). The pattern is parsed, never evaluated: only list
    literals of 0/1, `+` of lists and `*` by an integer, with the length checked before any
    list is built (a flag or YAML value from elsewhere cannot run code or exhaust memory)."""
    if isinstance(value, (int, list)):
        return value
    text = str(value).strip()
    if "[" not in text:
        try:
            return int(text)
        except ValueError:
            raise ValueError(
                f"--moe-layer-freq {text!r}: expected an integer or a 0/1 list pattern"
            ) from None
    try:
        pattern = _moe_freq_pattern(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, RecursionError) as e:
        raise ValueError(
            f"--moe-layer-freq {text!r}: expected a pattern of 0/1 lists joined by + and "
            f"repeated by * N, e.g. ([1]*3+[0]*1)*3 ({e})"
        ) from None
    return pattern


def _moe_freq_pattern(node) -> list[int]:
    if isinstance(node, ast.List):
        items = [n.value for n in node.elts if isinstance(n, ast.Constant)]
        if len(items) != len(node.elts) or any(
            type(x) is not int or x not in (0, 1) for x in items
        ):
            raise ValueError("list items must be 0 or 1")
        return items
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        out = _moe_freq_pattern(node.left) + _moe_freq_pattern(node.right)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        lst, num = (node.left, node.right)
        if isinstance(lst, ast.Constant):
            lst, num = num, lst
        if not (isinstance(num, ast.Constant) and type(num.value) is int and num.value >= 0):
            raise ValueError("a list may only be repeated by a non-negative integer")
        base = _moe_freq_pattern(lst)
        if len(base) * num.value > _MOE_FREQ_MAX_LAYERS:
            raise ValueError(f"longer than {_MOE_FREQ_MAX_LAYERS} layers")
        out = base * num.value
    else:
        raise ValueError(f"{type(node).__name__} is not allowed")
    if len(out) > _MOE_FREQ_MAX_LAYERS:
        raise ValueError(f"longer than {_MOE_FREQ_MAX_LAYERS} layers")
    return out


def _flag(group, flag, **kw):
    group.add_argument(flag, **kw)


def add_compat_args(p) -> None:
    """Add the flags of this module to parser `p` (one group per Megatron group)."""
    g = p.add_argument_group("megatron compatibility: model and kernels")
    _flag(
        g,
        "--attention-backend",
        type=str,
        default="auto",
        choices=[b.name for b in AttnBackend],
        help="flash | fused | unfused | local | auto: one attention math in gigatron "
        "(SDPA on the fast spec, DotProductAttention on the local one), same numbers",
    )
    _flag(g, "--use-mcore-models", action="store_true", dest="deprecated_use_mcore_models")
    _flag(g, "--use-legacy-models", action="store_true", help="refused: no legacy models")
    for flag, dest in (
        ("--no-masked-softmax-fusion", "masked_softmax_fusion"),
        ("--no-bias-gelu-fusion", "bias_gelu_fusion"),
        ("--no-bias-swiglu-fusion", "bias_swiglu_fusion"),
        ("--no-bias-dropout-fusion", "bias_dropout_fusion"),
        ("--no-rope-fusion", "apply_rope_fusion"),
        ("--no-async-tensor-model-parallel-allreduce", "async_tensor_model_parallel_allreduce"),
    ):
        _flag(g, flag, action="store_false", dest=dest, help="accepted; no effect (docs)")
    _flag(g, "--no-persist-layer-norm", action="store_true", help="accepted; no effect")
    _flag(g, "--attention-softmax-in-fp32", action="store_true", help="always so in gigatron")
    _flag(g, "--use-cpu-initialization", action="store_true", default=None)
    _flag(g, "--moe-layer-freq", type=moe_freq_type, default=1, help="int N or a 0/1 pattern")
    _flag(g, "--moe-expert-capacity-factor", type=float, default=None, help="None: dropless")
    _flag(g, "--moe-pad-expert-input-to-capacity", action="store_true")
    _flag(g, "--moe-token-drop-policy", type=str, default="probs", choices=["probs", "position"])
    # MoE router settings TransformerConfig implements (passed through with --num-experts)
    _flag(g, "--moe-router-score-function", type=str, default="softmax",
          choices=["softmax", "sigmoid"])  # fmt: skip
    _flag(g, "--moe-router-dtype", type=str, default=None, choices=["fp32", "fp64"])
    _flag(g, "--moe-router-topk-scaling-factor", type=float, default=None)
    _flag(g, "--moe-router-enable-expert-bias", action="store_true")
    _flag(g, "--moe-router-bias-update-rate", type=float, default=1e-3)
    _flag(g, "--moe-router-num-groups", type=int, default=None)
    _flag(g, "--moe-router-group-topk", type=int, default=None)
    _flag(g, "--moe-shared-expert-overlap", action="store_true")
    _flag(g, "--moe-shared-expert-gate", action="store_true",
          help="sigmoid gate on the shared experts' output (Qwen2-MoE)")  # fmt: skip
    _flag(g, "--moe-input-jitter-eps", type=float, default=None)
    _flag(g, "--moe-permute-fusion", action="store_true", help="accepted; no effect (docs)")
    _flag(g, "--moe-router-fusion", action="store_true", help="accepted; no effect (docs)")
    # deprecated spellings and architecture switches Megatron maps onto other settings
    _flag(g, "--no-position-embedding", action="store_false", dest="add_position_embedding")
    _flag(g, "--use-rotary-position-embeddings", action="store_true")
    _flag(g, "--recompute-activations", action="store_true", help="= --recompute-granularity "
          "selective")  # fmt: skip
    _flag(g, "--apply-query-key-layer-scaling", action="store_true")
    _flag(g, "--apply-layernorm-1p", action="store_true", help="zero-centred norm weights")
    _flag(g, "--squared-relu", action="store_true", help="relu(x)^2 MLP activation")

    g = p.add_argument_group("megatron compatibility: training")
    _flag(g, "--deterministic-mode", action="store_true",
          help="deterministic kernels (torch.use_deterministic_algorithms); slower")  # fmt: skip
    _flag(g, "--dataloader-type", type=str, default=None, choices=["single", "cyclic", "external"])
    _flag(g, "--no-data-sharding", action="store_false", dest="data_sharding",
          help="--dataloader-type cyclic: one shuffle over all ranks' samples, not one per "
          "rank's own bucket")  # fmt: skip
    _flag(g, "--no-create-attention-mask-in-dataloader", action="store_false",
          dest="create_attention_mask_in_dataloader")  # fmt: skip
    _flag(g, "--no-mmap-bin-files", action="store_false", dest="mmap_bin_files")
    _flag(g, "--num-dataset-builder-threads", type=int, default=1)
    _flag(g, "--no-overlap-p2p-communication", action="store_false", dest="overlap_p2p_comm")
    _flag(g, "--hysteresis", type=int, default=2, help="fp16: overflow steps before backing off")
    _flag(g, "--loss-scale-window", type=float, default=1000, help="fp16: steps between raises")
    _flag(g, "--min-loss-scale", type=float, default=1.0, help="fp16: lowest dynamic scale")
    # Megatron's current flag is the negative one; older versions had the positive one
    _flag(
        g,
        "--no-check-for-nan-in-loss-and-grad",
        action="store_false",
        dest="check_for_nan_in_loss_and_grad",
    )
    _flag(
        g,
        "--check-for-nan-in-loss-and-grad",
        action="store_true",
        dest="check_for_nan_in_loss_and_grad",
        default=True,
    )

    g = p.add_argument_group("megatron compatibility: backends (one line says what runs)")
    _flag(g, "--use-nccl-ub", action="store_true", dest="nccl_ub")
    for flag in ("--fsdp-manual-registration", "--enable-experimental",
                 "--export-force-local-attention", "--enable-gpt-oss"):  # fmt: skip
        _flag(g, flag, action="store_true")
    _flag(g, "--moe-flex-dispatcher-backend", type=str, default="deepep",
          choices=["deepep", "hybridep", "ncclep"],
          help="with --moe-token-dispatcher-type flex: the alltoall dispatcher runs")  # fmt: skip
    _flag(g, "--disable-bf16-reduced-precision-matmul", action="store_true",
          help="with --bf16: no reduced-precision reductions in CUDA bf16 matmuls")  # fmt: skip

    g = p.add_argument_group("megatron compatibility: checkpoints and logging")
    _flag(g, "--use-dist-ckpt", action="store_true", dest="use_dist_ckpt_deprecated")
    _flag(g, "--no-barrier-with-level-1-timing", action="store_false", dest="barrier_with_L1_time")


REFUSED_CKPT_FORMATS = {
    "torch": "Megatron's legacy per-rank torch.save files (mp_rank_XX/model_optim_rng.pt); "
    "gigatron writes and reads torch_dist (torch.distributed.checkpoint) only",
    "zarr": "no zarr backend",
}


# what gigatron.training.tokenizer.build_tokenizer builds; Megatron's other choices are refused
# here, before any process group starts (they failed later, inside the tokenizer builder)
TOKENIZER_TYPES = (
    "NullTokenizer",
    "GPT2BPETokenizer",
    "HuggingFaceTokenizer",
    "SentencePieceTokenizer",
    "GPTSentencePieceTokenizer",
    "Llama2Tokenizer",
    "TikTokenizer",
    "BertWordPieceLowerCase",
    "BertWordPieceCase",
    "SFTTokenizer",
)


def _weight_decay_schedule(args) -> None:
    """Megatron's rule: 'constant' takes --weight-decay and forbids --start/--end-weight-decay;
    'linear' / 'cosine' need both."""
    style = args.weight_decay_incr_style
    start, end = args.start_weight_decay, args.end_weight_decay
    if style == "constant":
        if start is not None or end is not None:
            raise ValueError(
                f"--start-weight-decay ({start}) / --end-weight-decay ({end}) need "
                "--weight-decay-incr-style linear or cosine (constant uses --weight-decay)"
            )
        args.start_weight_decay = args.end_weight_decay = args.weight_decay
    elif start is None or end is None:
        raise ValueError(
            f"--weight-decay-incr-style {style} needs both --start-weight-decay ({start}) and "
            f"--end-weight-decay ({end})"
        )


_NCCL_DETERMINISTIC_ALGOS = ("Tree", "Ring", "CollnetDirect", "CollnetChain", "^NVLS")


def _deterministic_mode(args) -> None:
    """Megatron's --deterministic-mode rules: no --use-flash-attn, no fused cross entropy, and on
    NCCL a fixed all-reduce algorithm (NCCL_ALGO); gigatron does not ask for NCCL_ALGO on gloo
    (CPU)."""
    if not args.deterministic_mode:
        return
    if getattr(args, "use_flash_attn", False):
        raise ValueError("--deterministic-mode cannot be used with --use-flash-attn")
    if args.cross_entropy_loss_fusion:
        raise ValueError("--deterministic-mode cannot be used with --cross-entropy-loss-fusion")
    nccl = (args.distributed_backend or ("nccl" if torch.cuda.is_available() else "gloo")) == "nccl"
    algo = os.environ.get("NCCL_ALGO")
    if nccl and algo not in _NCCL_DETERMINISTIC_ALGOS:
        raise ValueError(
            f"--deterministic-mode on NCCL needs NCCL_ALGO set to one of "
            f"{list(_NCCL_DETERMINISTIC_ALGOS)} (got {algo!r})"
        )


def _legacy_spellings(args) -> None:
    """Megatron's validate_args rules for its deprecated / derived flags."""
    if args.use_rotary_position_embeddings:
        args.position_embedding_type = "rope"
    if not args.add_position_embedding and args.position_embedding_type != "rope":
        raise ValueError(
            "--no-position-embedding is deprecated: use --position-embedding-type none (Megatron "
            "allows it only with rope)"
        )
    if args.recompute_activations:
        args.recompute_granularity = "selective"
    if args.dataloader_type is None:
        args.dataloader_type = "single"
    if not args.create_attention_mask_in_dataloader and args.reset_attention_mask:
        raise ValueError(
            "--no-create-attention-mask-in-dataloader with --reset-attention-mask: the "
            "per-document mask lives in the dataloader's attention mask"
        )
    if args.squared_relu and (args.swiglu or args.openai_gelu):
        raise ValueError("--squared-relu excludes --swiglu and --openai-gelu (one MLP activation)")
    if getattr(args, "quick_geglu", False) and (args.swiglu or args.squared_relu):
        raise ValueError("--quick-geglu excludes --swiglu and --squared-relu (one MLP activation)")


def _say(args, line: str) -> None:
    if getattr(args, "rank", 0) == 0:
        print(f"gigatron: {line}", flush=True)


def _backend_only(args) -> None:
    """One line per backend flag set: what runs instead (Megatron's recipes pass them)."""
    for dest, (flag, instead) in BACKEND_ONLY.items():
        if getattr(args, dest, False):
            _say(args, f"{flag}: {instead}")
    if args.moe_token_dispatcher_type == "flex":
        backend = args.moe_flex_dispatcher_backend
        _say(args, f"--moe-token-dispatcher-type flex (--moe-flex-dispatcher-backend {backend}): "
             "gigatron's alltoall dispatcher runs (the same routing and numbers; no "
             f"{backend} kernels)")  # fmt: skip
        args.moe_token_dispatcher_type = "alltoall"
    if args.disable_bf16_reduced_precision_matmul:
        if args.bf16:  # Megatron's TransformerConfig sets the same torch switch
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        _say(args, "--disable-bf16-reduced-precision-matmul: CUDA bf16 matmuls reduce in full "
             "precision" + ("" if args.bf16 else " (no effect without --bf16)"))  # fmt: skip


def validate_compat_args(args) -> None:
    """Derived values and refusals for the flags of this module (called by validate_args)."""
    _backend_only(args)
    if getattr(args, "use_legacy_models", False):
        raise ValueError("--use-legacy-models: gigatron has only the Megatron Core models")
    fmt = args.ckpt_format
    if fmt in REFUSED_CKPT_FORMATS:
        raise ValueError(f"--ckpt-format {fmt} is not supported: {REFUSED_CKPT_FORMATS[fmt]}")
    args.use_dist_ckpt = True  # Megatron: use_dist_ckpt = ckpt_format != 'torch'
    args.attention_backend = AttnBackend[args.attention_backend]
    _legacy_spellings(args)
    kind = args.tokenizer_type
    if kind is not None and kind not in TOKENIZER_TYPES:
        raise ValueError(f"--tokenizer-type {kind} is not supported; use one of {TOKENIZER_TYPES}")
    cp = args.context_parallel_size
    if cp > 1 and args.attention_dropout > 0:
        raise ValueError(
            f"--attention-dropout ({args.attention_dropout}) must be 0 with "
            f"--context-parallel-size {cp}: gigatron's context-parallel attention has no "
            "dropout; pass --attention-dropout 0"
        )
    _weight_decay_schedule(args)
    _deterministic_mode(args)
    if args.manual_gc_interval < 0:
        raise ValueError(f"--manual-gc-interval ({args.manual_gc_interval}) must be >= 0")
    freq = args.moe_layer_freq
    if isinstance(freq, int) and freq < 1:
        raise ValueError(f"--moe-layer-freq ({freq}) must be >= 1")
    if isinstance(freq, list) and len(freq) != args.num_layers:
        raise ValueError(
            f"--moe-layer-freq pattern has {len(freq)} entries, --num-layers is {args.num_layers}"
        )
    _moe_rules(args)


# MoE settings that mean something only with --num-experts -> their defaults (a changed one
# without experts was silently ignored; the kernel-fusion no-ops stay accepted)
_MOE_DEFAULTS = {
    "moe_layer_freq": 1,
    "moe_expert_capacity_factor": None,
    "moe_pad_expert_input_to_capacity": False,
    "moe_router_topk": 2,
    "moe_ffn_hidden_size": None,
    "moe_aux_loss_coeff": 0.0,
    "moe_token_dispatcher_type": "allgather",
    "moe_grouped_gemm": False,
    "moe_shared_expert_intermediate_size": None,
    "moe_router_load_balancing_type": "aux_loss",
    "moe_z_loss_coeff": None,
    "moe_router_pre_softmax": False,
    "moe_token_drop_policy": "probs",
    "moe_router_score_function": "softmax",
    "moe_router_dtype": None,
    "moe_router_topk_scaling_factor": None,
    "moe_router_enable_expert_bias": False,
    "moe_router_bias_update_rate": 1e-3,
    "moe_router_num_groups": None,
    "moe_router_group_topk": None,
    "moe_shared_expert_overlap": False,
    "moe_shared_expert_gate": False,
    "moe_input_jitter_eps": None,
    "moe_router_force_load_balancing": False,
}


def _moe_rules(args) -> None:
    """MoE flags need --num-experts; Megatron's expert-parallel rules (EP > 1 needs experts, a
    whole number of them per EP rank); top-k between 1 and the number of experts."""
    ep, experts = args.expert_model_parallel_size, args.num_experts
    if not experts:
        if ep > 1:
            raise ValueError(
                f"--expert-model-parallel-size {ep} needs --num-experts (a multiple of {ep}): "
                "without experts there is nothing to spread over expert-parallel ranks"
            )
        for name, default in _MOE_DEFAULTS.items():
            if getattr(args, name, default) != default:
                raise ValueError(f"--{name.replace('_', '-')} needs --num-experts")
        return
    if experts % ep:
        raise ValueError(
            f"--num-experts ({experts}) must be divisible by --expert-model-parallel-size ({ep}): "
            "each expert-parallel rank holds the same number of experts"
        )
    if not 1 <= args.moe_router_topk <= experts:
        raise ValueError(
            f"--moe-router-topk ({args.moe_router_topk}) must be between 1 and --num-experts "
            f"({experts}): each token goes to that many distinct experts"
        )
