"""The hand-declared flag groups of `gigatron.training.arguments.build_parser` (Megatron's names,
types, defaults and help), one function per group: model shape, MLA, parallelism, FP8, optimizer
and step, data, and gigatron's own logging / checkpoint additions. The flags of Megatron's
training config classes come from `gigatron.training.config` (`_config_flags`). The model and
optimizer flags are read back into the core configs by field name (`_config_from_args`).
Validation of the parsed values lives in `arguments.py`."""

from __future__ import annotations

from gigatron.training.compat_flags import moe_freq_type


def _int_tuple(text: str) -> tuple[int, ...]:
    """Megatron's tuple_type: "127,0" or "(127,0)" -> (127, 0)."""
    return tuple(int(i) for i in text.strip("()").split(","))


def _add(group, flag, type_=None, default=None, help_="", **kw):
    if type_ is bool:
        group.add_argument(flag, action="store_true", help=help_, **kw)
    else:
        group.add_argument(flag, type=type_, default=default, help=help_, **kw)


def _model_args(p):
    g = p.add_argument_group("model")
    _add(g, "--num-layers", int, None, "number of transformer layers")
    _add(g, "--hidden-size", int, None, "transformer hidden size")
    _add(
        g,
        "--ffn-hidden-size",
        int,
        None,
        "MLP hidden size (default 4 x hidden, or 8/3 with swiglu)",
    )
    _add(g, "--num-attention-heads", int, None, "number of attention heads")
    _add(g, "--kv-channels", int, None, "head dimension (default hidden / heads)")
    _add(g, "--group-query-attention", bool, help_="use grouped-query attention")
    _add(g, "--num-query-groups", int, 1, "number of key/value groups with --group-query-attention")
    _add(g, "--seq-length", int, None, "training sequence length")
    _add(g, "--max-position-embeddings", int, None, "maximum positions (learned embeddings)")
    _add(
        g,
        "--position-embedding-type",
        str,
        "learned_absolute",
        "learned_absolute | rope | yarn | none | relative (T5)",
        choices=["learned_absolute", "rope", "yarn", "none", "relative"],
    )
    _add(g, "--rotary-base", int, 10000, "RoPE base")
    _add(g, "--rotary-percent", float, 1.0, "fraction of the head dimension rotated")
    _add(g, "--rotary-interleaved", bool, help_="interleaved (GPT-J style) rotary")
    _add(g, "--use-rope-scaling", bool, help_="Llama-3.1 RoPE frequency scaling")
    _add(g, "--rope-scaling-factor", float, 8.0, "factor of --use-rope-scaling")
    _add(g, "--rotary-seq-len-interpolation-factor", float, None,
         "positions / this factor (linear RoPE scaling; Megatron's flag takes an int)")  # fmt: skip
    _add(
        g,
        "--normalization",
        str,
        "LayerNorm",
        "LayerNorm | RMSNorm",
        choices=["LayerNorm", "RMSNorm"],
    )
    _add(g, "--norm-epsilon", float, 1e-5, "epsilon of the norms")
    _add(g, "--swiglu", bool, help_="SwiGLU MLP")
    _add(g, "--quick-geglu", bool, help_="quick-GELU gated linear unit (GPT-OSS)")
    _add(g, "--glu-linear-offset", float, 0.0, "GLU: act(gate) * (up + offset)")
    _add(g, "--activation-func-clamp-value", float, None, "GLU: clamp gate <= v, up to [-v, v]")
    _add(g, "--window-size", _int_tuple, None, "sliding window 'left,right' (-1: unbounded)")
    _add(
        g,
        "--window-attn-skip-freq",
        moe_freq_type,  # Megatron's type: an int or a 0/1 list pattern
        None,
        "full-attention layers under --window-size: every N-th, or a 0/1 list (1 = window)",
    )
    _add(
        g,
        "--softmax-type",
        str,
        "vanilla",
        "attention softmax: vanilla | off-by-one | learnable (per-head sinks)",
        choices=["vanilla", "off-by-one", "learnable"],
    )
    _add(g, "--openai-gelu", bool, help_="tanh-approximated GELU (GPT-2)")
    _add(g, "--disable-bias-linear", bool, help_="no biases in linear layers")
    _add(g, "--add-qkv-bias", bool, help_="bias in the QKV projection only")
    _add(g, "--qk-layernorm", bool, help_="normalise queries and keys")
    _add(g, "--untie-embeddings-and-output-weights", bool, help_="separate output layer weights")
    _add(g, "--init-method-std", float, 0.02, "std of the normal weight init")
    _add(g, "--hidden-dropout", float, 0.1, "dropout on hidden states")
    _add(g, "--attention-dropout", float, 0.1, "dropout on attention probabilities")
    _add(g, "--apply-residual-connection-post-layernorm", bool, help_="post-LN residual")
    _add(g, "--make-vocab-size-divisible-by", int, 128, "pad vocab to a multiple of this x TP")
    _add(
        g,
        "--transformer-impl",
        str,
        "local",
        "local | transformer_engine (local only here)",
        choices=["local", "transformer_engine"],
    )
    _add(g, "--use-flash-attn", bool, help_="fast attention path (SDPA flash/cuDNN on GPU)")
    _add(g, "--num-experts", int, None, "number of MoE experts")
    _add(g, "--moe-router-topk", int, 2, "experts per token")
    _add(g, "--moe-ffn-hidden-size", int, None, "expert MLP hidden size")
    _add(g, "--moe-aux-loss-coeff", float, 0.0, "load-balancing loss weight")
    _add(g, "--moe-token-dispatcher-type", str, "allgather", "allgather | alltoall")
    _add(g, "--moe-grouped-gemm", bool, help_="grouped GEMM experts")
    _add(g, "--moe-shared-expert-intermediate-size", int, None, "shared expert size")
    _add(g, "--moe-router-load-balancing-type", str, "aux_loss", "aux_loss | seq_aux_loss | none")
    _add(g, "--moe-z-loss-coeff", float, None, "router z-loss weight")
    _add(g, "--moe-router-pre-softmax", bool, help_="softmax before the top-k selection")
    _add(g, "--moe-router-force-load-balancing", bool,
         help_="benchmarks: route on random logits (balanced load; gradients pass straight "
         "through to the gate)")  # fmt: skip
    _add(g, "--moe-per-layer-logging", bool, help_="log the MoE auxiliary losses of each layer")
    _add(g, "--mtp-num-layers", int, None, "multi-token prediction depths (DeepSeek-V3 MTP)")
    _add(g, "--mtp-loss-scaling-factor", float, 0.1, "weight of the mean MTP loss")
    _add(g, "--mtp-use-repeated-layer", bool, help_="one MTP layer applied at every depth")
    _add(g, "--mtp-detach-heads", bool, help_="MTP loss trains the MTP layers only")


def _parallel_args(p):
    g = p.add_argument_group("parallelism")
    _add(g, "--tensor-model-parallel-size", int, 1, "TP size")
    _add(g, "--pipeline-model-parallel-size", int, 1, "PP size")
    _add(g, "--num-layers-per-virtual-pipeline-stage", int, None, "layers per virtual stage")
    _add(g, "--virtual-pipeline-model-parallel-size", int, None, "virtual stages per PP rank")
    _add(g, "--context-parallel-size", int, 1, "CP size")
    _add(g, "--cp-comm-type", str, "p2p", "p2p | all_gather | a2a")
    _add(g, "--expert-model-parallel-size", int, 1, "EP size")
    _add(g, "--expert-tensor-parallel-size", int, None, "TP size inside experts")
    _add(g, "--sequence-parallel", bool, help_="sequence parallelism (needs TP > 1)")
    _add(g, "--tp-comm-overlap", bool, help_="overlap the SP all-gather with GEMMs (gigatron's)")
    _add(g, "--use-distributed-optimizer", bool, help_="shard optimizer state over DP")
    _add(g, "--overlap-grad-reduce", bool, help_="reduce gradients during backward")
    _add(g, "--overlap-param-gather", bool, help_="gather parameters during forward")
    _fsdp_args(g)
    g.add_argument(
        "--no-gradient-accumulation-fusion",
        dest="gradient_accumulation_fusion",
        action="store_false",
        help="compute each weight gradient apart and let DDP add it to main_grad (default: "
        "the linears add it into main_grad with one addmm_, as Megatron's apex kernel does)",
    )
    g.add_argument(
        "--no-wgrad-gemm-accum-fp32",
        dest="wgrad_gemm_accum_fp32",
        action="store_false",
        help="gigatron-only: with fp32 gradient buffers and bf16/fp16 activations, compute dW "
        "in the activation dtype and add it to main_grad in fp32 (default on CUDA: one GEMM "
        "accumulating into fp32, as apex's wgrad_gemm_accum_fp32); for A/B measurements",
    )
    _add(g, "--ddp-bucket-size", int, None, "gradient bucket size (elements)")
    _add(g, "--accumulate-allreduce-grads-in-fp32", bool, help_="fp32 gradient buffers")


def _fsdp_args(g):
    """Megatron-FSDP's and FSDP2's flags (docs/fsdp.md); validated in `_fsdp_args.py`."""
    dtypes = ["fp32", "bf16", "fp16", "auto"]
    _add(g, "--data-parallel-sharding-strategy", str, "optim_grads_params",
         "with --use-megatron-fsdp: what is sharded over DP (ZeRO-0 to 3)",
         choices=["no_shard", "optim", "optim_grads", "optim_grads_params"])  # fmt: skip
    _add(g, "--megatron-fsdp-version", int, 1, "Megatron-FSDP implementation (one engine here)",
         choices=[1, 2])  # fmt: skip
    _add(g, "--megatron-fsdp-main-params-dtype", str, "fp32",
         "Megatron-FSDP main (sharded) params dtype (fp32 only)", choices=dtypes)  # fmt: skip
    _add(g, "--megatron-fsdp-main-grads-dtype", str, "auto",
         "Megatron-FSDP grad reduction dtype (auto: fp32 with --bf16 unless "
         "--grad-reduce-in-bf16)", choices=dtypes)  # fmt: skip
    _add(g, "--megatron-fsdp-grad-comm-dtype", str, "auto",
         "Megatron-FSDP grad communication dtype (auto: the main grads dtype)",
         choices=dtypes)  # fmt: skip
    g.add_argument(
        "--torch-fsdp2-no-reshard-after-forward",
        action="store_false",
        dest="torch_fsdp2_reshard_after_forward",
        help="with --use-torch-fsdp2: keep gathered params from forward to backward",
    )


def _emerging_optimizer_args(g):
    """Megatron's Muon / Lion flags (its defaults: --muon-momentum 0.9 here, 0.95 in the
    config)."""
    _add(g, "--muon-momentum", float, 0.9, "Muon's momentum")
    g.add_argument(
        "--muon-no-split-qkv",
        action="store_false",
        default=True,
        dest="muon_split_qkv",
        help="orthogonalise the fused QKV weight as one matrix",
    )
    _add(g, "--muon-nesterov", bool, help_="Nesterov momentum in Muon")
    _add(
        g,
        "--muon-scale-mode",
        str,
        "spectral",
        "scale of Muon's update",
        choices=["spectral", "unit_rms_norm", "shape_scaling"],
    )
    _add(
        g,
        "--muon-fp32-matmul-prec",
        str,
        "medium",
        "fp32 matmul precision of Newton-Schulz ('medium': bf16 iteration)",
        choices=["low", "medium", "high"],
    )
    _add(g, "--muon-coefficient-type", str, "quintic", "Newton-Schulz coefficient set")
    _add(g, "--muon-num-ns-steps", int, 5, "Newton-Schulz iterations")
    _add(
        g,
        "--muon-tp-mode",
        str,
        "duplicated",
        "TP-split weights: duplicated | distributed (whole matrix) | blockwise (per shard)",
        choices=["blockwise", "duplicated", "distributed"],
    )
    _add(g, "--muon-extra-scale-factor", float, 1.0, "extra factor on Muon's update")
    _add(
        g,
        "--muon-scalar-optimizer",
        str,
        "adam",
        "optimizer of the params Muon does not take",
        choices=["adam", "lion"],
    )
    _add(g, "--lion-beta1", float, 0.95, "Lion's beta of the sign update")
    _add(g, "--lion-beta2", float, 0.98, "Lion's beta of the momentum EMA")


def _training_args(p):
    g = p.add_argument_group("optimizer, precision and step")
    _add(g, "--lr", float, None, "peak learning rate")
    _add(g, "--min-lr", float, 0.0, "minimum learning rate")
    _add(g, "--decoupled-lr", float, None, "peak learning rate of the embedding and output layer")
    _add(g, "--decoupled-min-lr", float, None, "minimum learning rate of --decoupled-lr's params")
    _add(g, "--weight-decay", float, 0.01, "weight decay")
    _add(g, "--clip-grad", float, 1.0, "gradient clipping by global norm (0 disables)")
    _add(g, "--adam-beta1", float, 0.9, "Adam beta1")
    _add(g, "--adam-beta2", float, 0.999, "Adam beta2")
    _add(g, "--adam-eps", float, 1e-8, "Adam epsilon")
    _add(
        g,
        "--optimizer",
        str,
        "adam",
        "adam | sgd | muon | lion (muon / lion: 2-D weights; embeddings, output, norms and "
        "biases on Adam)",
        choices=["adam", "sgd", "muon", "lion"],
    )
    _add(g, "--sgd-momentum", float, 0.9, "SGD momentum")
    _emerging_optimizer_args(g)
    _add(g, "--bf16", bool, help_="bf16 parameters with fp32 main weights")
    _add(g, "--fp16", bool, help_="fp16 parameters with loss scaling")
    _add(g, "--grad-reduce-in-bf16", bool, help_="with --bf16: bf16 gradient buffers and "
         "reductions (default: fp32)")  # fmt: skip
    _add(g, "--loss-scale", float, None, "static loss scale (default dynamic)")
    _add(g, "--initial-loss-scale", float, 2.0**32, "initial dynamic loss scale")
    _add(g, "--recompute-granularity", str, None, "full | selective", choices=["full", "selective"])
    _add(g, "--recompute-method", str, None, "uniform | block", choices=["uniform", "block"])
    _add(g, "--recompute-num-layers", int, None, "layers recomputed")
    _add(g, "--recompute-modules", str, None, "with --recompute-granularity selective: "
         "core_attn (default) mlp moe shared_experts moe_act layernorm mla_up_proj",
         nargs="*")  # fmt: skip
    _add(g, "--calculate-per-token-loss", bool, help_="average the loss over all tokens of a step")
    _add(g, "--cross-entropy-loss-fusion", bool, help_="output layer + cross entropy in chunks")
    _add(
        g,
        "--cross-entropy-fusion-impl",
        str,
        "native",
        "native (gigatron's chunked kernel) or native_grad_in_forward (gigatron-only: gradients "
        "computed in forward, one logits matmul fewer); 'te' needs Transformer Engine",
        choices=["native", "native_grad_in_forward"],
    )
    _add(
        g,
        "--torch-compile",
        str,
        "none",
        "gigatron addition: 'layers' compiles every TransformerLayer with torch.compile, "
        "'model' the whole model (fewer graphs, less launch overhead; needs PP = 1)",
        choices=["none", "layers", "model"],
    )
    _add(
        g,
        "--torch-compile-mode",
        str,
        None,
        "gigatron addition: torch.compile mode of --torch-compile; 'reduce-overhead' adds CUDA "
        "graphs (per layer: DDP overlap kept, less launch overhead)",
        choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
    )
    _add(
        g,
        "--torch-compile-layers-per-graph",
        str,
        "1",
        "gigatron addition: compile runs of this many consecutive layers as one graph each, or "
        "a comma list of group sizes in layer order (4,20) "
        "(--torch-compile layers: fusion across layer boundaries; --torch-compile model: the "
        "model's graphs stop around the groups, so DDP buckets start after each group's "
        "backward instead of after the whole backward)",
    )
    _add(
        g,
        "--skip-nan-steps",
        bool,
        help_="skip a step with a non-finite loss or grad (default: stop)",
    )
    g.add_argument(
        "--flat-adam-step",
        dest="flat_adam_step",
        action="store_const",
        const=True,
        default=None,
        help="gigatron-only: force the distributed optimizer's flat fused Adam step (default: "
        "used where it applies: CUDA, Adam / AdamW, fp32 grad buffers, no loss scaler)",
    )
    g.add_argument(
        "--no-flat-adam-step",
        dest="flat_adam_step",
        action="store_const",
        const=False,
        default=None,
        help="gigatron-only: torch's fused Adam instead of the flat fused Adam step",
    )
    _add(
        g,
        "--sync-free-step",
        bool,
        help_="gigatron-only, experimental: an optimizer step with no host sync (clipping and "
        "the skip of a NaN/Inf step on the GPU; a NaN/Inf step is reported at the next log line)",
    )


def _data_args(p):
    g = p.add_argument_group("data")
    _add(g, "--data-path", str, None, "weight prefix [weight prefix ...]", nargs="*")
    _add(g, "--split", str, "969, 30, 1", "train, valid, test proportions")
    _add(g, "--mock-data", bool, help_="random tokens instead of a corpus")
    _add(g, "--data-cache-path", str, None, "where dataset indices are cached")
    _add(g, "--num-workers", int, 2, "dataloader workers")
    _add(g, "--reset-position-ids", bool, help_="reset position ids at end of document")
    _add(g, "--reset-attention-mask", bool, help_="reset attention at end of document")
    _add(
        g,
        "--dataloader-inter-document-masking",
        bool,
        help_="packed sequences: cu_seqlens at document bounds, no attention across them",
    )
    _add(g, "--eod-mask-loss", bool, help_="mask the loss on end-of-document tokens")
    g = p.add_argument_group("sft")
    _add(
        g,
        "--sft",
        bool,
        help_="Megatron SFT training: --data-path names JSONL conversations "
        "(loss on assistant answers only, conversations of a line packed into one row)",
    )
    _add(g, "--sft-tokenizer-prompt-format", str, "nemotron-h-aligned",
         "SFT prompt format (--tokenizer-type SFTTokenizer): default (the tokenizer's chat "
         "template), identity, nemotron-h-aligned, nemotron-nano-v2")  # fmt: skip


def _lora_args(p):
    g = p.add_argument_group("gigatron: LoRA (Megatron-Bridge's LoRA config as flags)")
    _add(g, "--lora-rank", int, None, "gigatron: LoRA rank (Bridge's dim); set: base weights "
         "frozen, adapters trained, --save writes adapter-only checkpoints")  # fmt: skip
    _add(g, "--lora-alpha", int, 32, "gigatron: LoRA alpha (update scale alpha / rank)")
    _add(g, "--lora-dropout", float, 0.0, "gigatron: dropout on the adapters' input")
    _add(g, "--lora-target-modules", str, ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
         "gigatron: layers to adapt", nargs="+",
         choices=["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"])  # fmt: skip


def _checkpoint_logging_args(p):
    g = p.add_argument_group("gigatron: checkpoints, logging and YAML")
    _add(g, "--ckpt-verify-integrity", bool, help_="check the SHA-256 manifest on load (gigatron)")
    _add(g, "--no-progress-bar", bool, help_="no progress bar")
    _add(g, "--no-profile-stacks", bool, help_="gigatron: record no shapes/Python stacks (light)")
    _add(g, "--timeline", str, None,
         "gigatron: write the pipeline timeline (each forward, backward, send, receive per rank) "
         "of the --timeline-iters iterations to this Chrome trace JSON file")  # fmt: skip
    _add(g, "--timeline-iters", int, [1], "gigatron: iterations --timeline records", nargs="+")
    _add(g, "--yaml-cfg", str, None, "YAML file holding any of these flags")


def _fp8_args(p):
    """Megatron's FP8 flags (transformer_engine group); gigatron runs them on torchao."""
    g = p.add_argument_group("fp8 (needs the fp8 extra: torchao)")
    _add(
        g, "--fp8-format", str, None,
        "FP8 GEMMs in the transformer layers: e4m3 (gradients too) or hybrid (e5m2 gradients)",
        choices=["e4m3", "hybrid"], dest="fp8",
    )  # fmt: skip
    _add(
        g, "--fp8-recipe", str, "delayed",
        "delayed (amax history, Megatron's default) | tensorwise | rowwise | rowwise_with_gw_hp "
        "(current scaling); mxfp8, blockwise and custom are refused",
        choices=["tensorwise", "rowwise", "rowwise_with_gw_hp", "delayed", "mxfp8", "blockwise",
                 "custom"],
    )  # fmt: skip
    _add(g, "--fp8-margin", int, 0, "scales are divided by 2**margin")
    _add(g, "--fp8-interval", int, 1, "deprecated, ignored with a warning (as by TE >= 1.8)")
    _add(g, "--fp8-amax-history-len", int, 1, "delayed scaling: amaxes kept per tensor")
    _add(
        g, "--fp8-amax-compute-algo", str, "most_recent",
        "delayed scaling: the amax a scale comes from", choices=["max", "most_recent"],
    )  # fmt: skip
    _add(g, "--tp-only-amax-red", bool, help_="delayed scaling: reduce amaxes over TP (x CP) only")
    g.add_argument(
        "--no-fp8-wgrad", dest="fp8_wgrad", action="store_false",
        help="weight-gradient GEMM in the model dtype",
    )  # fmt: skip
    _add(g, "--first-last-layers-bf16", bool, help_="keep the first / last layers out of FP8")
    _add(g, "--num-layers-at-start-in-bf16", int, 1, "with --first-last-layers-bf16")
    _add(g, "--num-layers-at-end-in-bf16", int, 1, "with --first-last-layers-bf16")


def _mla_args(p):
    """Megatron's --multi-latent-attention group (its names and defaults; docs/mla.md). The
    --yarn-* flags, Megatron's for YaRN positions, set MLA's YaRN too (else its defaults);
    with --position-embedding-type yarn they, --rotary-scaling-factor, --mscale and
    --mscale-all-dim fill the TransformerConfig's yarn_* fields (GPT-OSS)."""
    g = p.add_argument_group("multi-latent attention")
    _add(g, "--multi-latent-attention", bool, help_="DeepSeek MLA (MLATransformerConfig)")
    _add(g, "--q-lora-rank", int, None, "query latent rank (None: one full-rank q projection)")
    _add(g, "--kv-lora-rank", int, 32, "key/value latent rank")
    _add(g, "--qk-head-dim", int, 128, "q/k head dim without RoPE")
    _add(g, "--qk-pos-emb-head-dim", int, 64, "q/k rotary head dim")
    _add(g, "--v-head-dim", int, 128, "value head dim")
    _add(g, "--rope-type", str, None, "rope | yarn (MLA default: yarn)", choices=["rope", "yarn"])
    _add(g, "--rotary-scaling-factor", float, 1.0, "YaRN scaling factor")
    _add(g, "--mscale", float, 1.0, "YaRN mscale")
    _add(g, "--mscale-all-dim", float, 0.0, "YaRN mscale_all_dim")
    _add(g, "--yarn-original-max-position-embeddings", int, None, "YaRN original context")
    _add(g, "--yarn-beta-fast", float, None, "YaRN beta_fast")
    _add(g, "--yarn-beta-slow", float, None, "YaRN beta_slow")
    g.add_argument(
        "--yarn-correction-range-round-to-int",
        action="store_true",
        default=None,
        help="round the YaRN ramp's channel bounds to integers (the default)",
    )
    g.add_argument("--no-yarn-correction-range-round-to-int", action="store_false",
                   default=None, dest="yarn_correction_range_round_to_int",
                   help="do not round them (GPT-OSS; HF's truncate: false)")  # fmt: skip


def _hybrid_args(p):
    """Megatron's hybrid-model flags (Mamba-2 layers; docs/hybrid.md)."""
    g = p.add_argument_group("hybrid models (Mamba-2)")
    _add(g, "--hybrid-layer-pattern", str, None,
         "one symbol per layer: M mamba, * attention, - MLP, E MoE; | between pipeline stages "
         "(e.g. 'M*M-|M-M*'); sets --num-layers")  # fmt: skip
    _add(g, "--hybrid-override-pattern", str, None, "deprecated: --hybrid-layer-pattern")
    spec_help = "<module> <name> of the stack spec (pretrain_hybrid only)"
    _add(g, "--spec", str, None, spec_help, nargs="*")
    _add(g, "--is-hybrid-model", bool, help_="the model is a hybrid (set by the pattern)")
    _add(g, "--mamba-state-dim", int, 128, "SSM state size of the Mamba layers")
    _add(g, "--mamba-head-dim", int, 64, "head dimension of the Mamba layers")
    _add(g, "--mamba-num-groups", int, 8, "B/C groups of the Mamba layers")
    _add(g, "--mamba-num-heads", int, None, "Mamba heads (None: 2 * hidden / head dim)")
    g.add_argument("--disable-mamba-mem-eff-path", action="store_false",
                   dest="use_mamba_mem_eff_path",
                   help="accepted: one pure-PyTorch Mamba path either way")  # fmt: skip
