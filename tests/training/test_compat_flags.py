"""Megatron example-script flags (gigatron.training.compat_flags): each parses to Megatron's
attribute, no-ops are documented, refused values raise a ValueError naming the flag, the
weight-decay schedule equals megatron-core's scheduler, "did you mean" suggests related flags."""

import pytest
import torch

from gigatron.core.transformer.enums import AttnBackend
from gigatron.training.arguments import (
    _known_flags,
    build_parser,
    parse_args,
    suggest_flag,
    validate_args,
)
from gigatron.training.compat_flags import NO_OPS, moe_freq_type
from tests._paths import REPO

BASE = (
    "--num-layers 4 --hidden-size 16 --num-attention-heads 2 --seq-length 8 "
    "--micro-batch-size 1 --global-batch-size 4 --train-iters 10 --lr 1e-3 --mock-data"
).split()
DOCS = REPO / "docs" / "training.md"


def _args(*extra, validate=True):
    args = parse_args(argv=BASE + list(extra))
    return validate_args(args, world_size=1) if validate else args


@pytest.mark.parametrize(
    "flags, attr, value",
    [
        ("--attention-backend flash", "attention_backend", AttnBackend.flash),
        ("--attention-backend unfused", "attention_backend", AttnBackend.unfused),
        ("", "attention_backend", AttnBackend.auto),
        ("--use-mcore-models", "deprecated_use_mcore_models", True),
        ("--no-masked-softmax-fusion", "masked_softmax_fusion", False),
        ("", "masked_softmax_fusion", True),
        ("--no-bias-gelu-fusion", "bias_gelu_fusion", False),
        ("--no-bias-swiglu-fusion", "bias_swiglu_fusion", False),
        ("--no-bias-dropout-fusion", "bias_dropout_fusion", False),
        ("--no-rope-fusion", "apply_rope_fusion", False),
        ("--no-persist-layer-norm", "no_persist_layer_norm", True),
        ("--attention-softmax-in-fp32", "attention_softmax_in_fp32", True),
        (
            "--no-async-tensor-model-parallel-allreduce",
            "async_tensor_model_parallel_allreduce",
            False,
        ),
        ("--use-cpu-initialization", "use_cpu_initialization", True),
        ("--no-save-optim", "no_save_optim", True),
        ("--no-save-rng", "no_save_rng", True),
        ("--ckpt-format torch_dist", "ckpt_format", "torch_dist"),
        ("--use-dist-ckpt", "use_dist_ckpt", True),
        ("--log-params-norm", "log_params_norm", True),
        ("--log-timers-to-tensorboard", "log_timers_to_tensorboard", True),
        ("--log-validation-ppl-to-tensorboard", "log_validation_ppl_to_tensorboard", True),
        ("--log-memory-to-tensorboard", "log_memory_to_tensorboard", True),
        ("--log-world-size-to-tensorboard", "log_world_size_to_tensorboard", True),
        ("--no-log-loss-scale-to-tensorboard", "log_loss_scale_to_tensorboard", False),
        ("--log-throughput", "log_throughput", True),
        ("--timing-log-level 2", "timing_log_level", 2),
        ("--manual-gc", "manual_gc", True),
        ("--manual-gc-interval 7", "manual_gc_interval", 7),
        ("--no-manual-gc-eval", "manual_gc_eval", False),
        ("--skip-train", "skip_train", True),
        ("", "check_for_nan_in_loss_and_grad", True),
        ("--check-for-nan-in-loss-and-grad", "check_for_nan_in_loss_and_grad", True),
        ("--no-check-for-nan-in-loss-and-grad", "check_for_nan_in_loss_and_grad", False),
        ("--empty-unused-memory-level 2", "empty_unused_memory_level", 2),
        ("--lr-warmup-init 1e-5", "lr_warmup_init", 1e-5),
        ("--exit-on-missing-checkpoint", "exit_on_missing_checkpoint", True),
        ("--transformer-impl local", "transformer_impl", "local"),
        ("--transformer-impl transformer_engine", "transformer_impl", "local"),
        ("--no-gradient-accumulation-fusion", "gradient_accumulation_fusion", False),
        ("--distributed-backend gloo", "distributed_backend", "gloo"),
        ("--tokenizer-type GPT2BPETokenizer", "tokenizer_type", "GPT2BPETokenizer"),
        ("--data-cache-path /tmp/x", "data_cache_path", "/tmp/x"),
        ("--num-workers 0", "num_workers", 0),
        ("--seed 7", "seed", 7),
        ("--init-method-std 0.006", "init_method_std", 0.006),
        ("--use-flash-attn", "use_flash_attn", True),
        ("--bf16", "params_dtype", torch.bfloat16),
        ("--num-experts 4 --moe-layer-freq 2", "moe_layer_freq", 2),
        ("--num-experts 4 --moe-expert-capacity-factor 1.25", "moe_expert_capacity_factor", 1.25),
        ("--weight-decay 0.1", "start_weight_decay", 0.1),
        ("--weight-decay 0.1", "end_weight_decay", 0.1),
        ("--use-rotary-position-embeddings", "position_embedding_type", "rope"),
        ("--position-embedding-type rope --no-position-embedding", "add_position_embedding", 0),
        ("--recompute-activations", "recompute_granularity", "selective"),
        ("--dataloader-type single", "dataloader_type", "single"),
        ("--dataloader-type cyclic", "dataloader_type", "cyclic"),
        ("--dataloader-type external", "dataloader_type", "external"),
        ("", "dataloader_type", "single"),
        ("--no-data-sharding", "data_sharding", False),
        ("", "data_sharding", True),
        ("--no-create-attention-mask-in-dataloader", "create_attention_mask_in_dataloader", 0),
        ("--no-mmap-bin-files", "mmap_bin_files", False),
        ("--num-dataset-builder-threads 4", "num_dataset_builder_threads", 4),
        ("--no-overlap-p2p-communication", "overlap_p2p_comm", False),
        ("--local-rank 3", "local_rank", 3),
        ("--auto-detect-ckpt-format", "auto_detect_ckpt_format", True),
        ("--moe-permute-fusion", "moe_permute_fusion", True),
    ],
)
def test_flag_parses_to_megatron_attribute(flags, attr, value):
    assert getattr(_args(*flags.split()), attr) == value


def test_every_no_op_is_documented_with_its_reason():
    text = DOCS.read_text()
    known = set(_known_flags(build_parser()))
    for flag in NO_OPS:
        assert flag in known, flag
        assert f"`{flag}`" in text, f"{flag} missing from docs/training.md"


@pytest.mark.parametrize(
    "flags, words",
    [
        ("--ckpt-format torch", ["--ckpt-format torch", "torch_dist"]),
        ("--ckpt-format zarr", ["--ckpt-format zarr"]),
        ("--use-legacy-models", ["--use-legacy-models"]),
        ("--start-weight-decay 0.0", ["--start-weight-decay", "linear or cosine"]),
        ("--weight-decay-incr-style linear --start-weight-decay 0", ["--end-weight-decay"]),
        ("--moe-layer-freq 2", ["--moe-layer-freq", "--num-experts"]),
        ("--moe-expert-capacity-factor 1.0", ["--num-experts"]),
        ("--num-experts 2 --moe-layer-freq [1,0]", ["2 entries", "--num-layers is 4"]),
        ("--manual-gc-interval -1", ["--manual-gc-interval"]),
        ("--bf16 --fp16", ["--fp16", "--bf16"]),
        ("--no-position-embedding", ["--no-position-embedding", "--position-embedding-type"]),
        (
            "--no-create-attention-mask-in-dataloader --reset-attention-mask",
            ["--reset-attention-mask"],
        ),
        ("--squared-relu --swiglu", ["--squared-relu"]),
        ("--tokenizer-type MultimodalTokenizer", ["--tokenizer-type", "GPT2BPETokenizer"]),
        (
            "--deterministic-mode --cross-entropy-loss-fusion",
            ["--deterministic-mode", "--cross-entropy-loss-fusion"],
        ),
        ("--deterministic-mode --distributed-backend nccl", ["NCCL_ALGO", "'Ring'", "None"]),
    ],
)
def test_refused_values_name_the_flag(flags, words, monkeypatch):
    monkeypatch.delenv("NCCL_ALGO", raising=False)
    with pytest.raises(ValueError) as err:
        _args(*flags.split())
    for word in words:
        assert word in str(err.value)


def test_moe_layer_freq_patterns():
    assert moe_freq_type("3") == 3
    assert moe_freq_type("([1]*3+[0]*1)*2") == [1, 1, 1, 0] * 2
    assert moe_freq_type("[1]*2+2*[0]") == [1, 1, 0, 0]
    for bad in ("[__import__('os')]", "[2, 0]", "[1]*(2+1)", "[1]*-1", "[1] - [0]", "[1.0]",
                "[True]", "[1]*[1]", "[[1]]", "x", "[1]*3 if 1 else 0"):  # fmt: skip
        with pytest.raises(ValueError, match="moe-layer-freq"):
            moe_freq_type(bad)
    # the length is checked before the list is built (this would take ~80 GB)
    with pytest.raises(ValueError, match="longer than"):
        moe_freq_type("[1]*100000*100000")
    args = _args("--num-experts", "2", "--moe-layer-freq", "([0]+[1]*3)")
    assert args.moe_layer_freq == [0, 1, 1, 1]


@pytest.mark.parametrize(
    "typo, expected",
    [
        ("--log-num-zero-in-grad", "--log-num-zeros-in-grad"),
        ("--lr-decay-stile", "--lr-decay-style"),
        ("--hiden-size", "--hidden-size"),
        ("--log-params-norms", "--log-params-norm"),
        ("--moe-layer-frequency", "--moe-layer-freq"),
    ],
)
def test_did_you_mean_suggests_the_related_flag(typo, expected):
    assert suggest_flag(typo, _known_flags(build_parser())) == expected


def test_did_you_mean_stays_silent_for_unrelated_words(capsys):
    known = _known_flags(build_parser())
    assert suggest_flag("--foo-bar", known) is None
    # the audit's case: similar letters, no shared words
    assert suggest_flag("--log-num-zero-grads", known) != "--num-attention-heads"
    with pytest.raises(SystemExit):
        parse_args(argv=BASE + ["--frobnicate-widgets"])
    assert "did you mean" not in capsys.readouterr().err


def _megatron_wd(style, start, end, step, total):
    """megatron-core's OptimizerParamScheduler.get_wd, the installed package as the oracle."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    class _Opt:  # the scheduler reads param_groups only
        param_groups = [{"params": [], "lr": 0.0, "weight_decay": 0.0}]

    sched = OptimizerParamScheduler(
        _Opt(), 0.0, 1e-3, 0.0, 0, total, "constant", start, end, total, style
    )
    sched.num_steps = step
    return sched.get_wd()


@pytest.mark.parametrize("style", ["linear", "cosine", "constant"])
def test_weight_decay_schedule_equals_megatron_core(style):
    """scheduler_from_args (what pretrain builds) steps the weight decay from --start- to
    --end-weight-decay over train_iters x global_batch samples, as megatron-core computes it;
    --lr-decay-iters does not shorten it (it did: wd_incr_steps was the lr decay length)."""
    from gigatron.training._config_from_args import scheduler_from_args

    pytest.importorskip("megatron.core")
    wd = "" if style == "constant" else "--start-weight-decay 0.01 --end-weight-decay 0.2"
    args = _args("--weight-decay-incr-style", style, "--lr-decay-iters", "4", *wd.split())
    param = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([param], lr=1e-3, weight_decay=0.0)
    sched = scheduler_from_args(args, opt)
    start, end = args.start_weight_decay, args.end_weight_decay
    total = args.train_iters * args.global_batch_size
    for it in range(1, args.train_iters + 3):
        sched.step(increment=args.global_batch_size)
        want = _megatron_wd(style, start, end, it * args.global_batch_size, total)
        assert opt.param_groups[0]["weight_decay"] == pytest.approx(want, rel=1e-12, abs=1e-15)
    if style != "constant":
        assert want == pytest.approx(0.2)


def test_weight_decay_schedule_by_samples():
    from gigatron.training._config_from_args import scheduler_from_args

    args = parse_args(
        argv=[a for a in BASE if a not in ("--train-iters", "10")]
        + "--train-samples 40 --weight-decay-incr-style linear".split()
        + "--start-weight-decay 0.0 --end-weight-decay 0.4".split()
    )
    args = validate_args(args, world_size=1)
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    sched = scheduler_from_args(args, opt)
    sched.step(increment=10)
    assert opt.param_groups[0]["weight_decay"] == pytest.approx(0.1)  # 10 / 40 of the way


class _Writer:
    def __init__(self):
        self.scalars = {}

    def add_scalar(self, key, value, step):
        self.scalars[key] = (value, step)


def test_extra_tensorboard_scalars():
    from gigatron.training import _training_log as tlog

    args = _args("--log-memory-to-tensorboard", "--log-world-size-to-tensorboard")
    writer = _Writer()
    tlog.write_extra_scalars(args, writer, 3, {"loss_scale": 1024.0})
    assert writer.scalars["loss-scale"] == (1024.0, 3)
    assert writer.scalars["world-size"] == (1, 3)
    assert any(k.startswith("mem-") for k in writer.scalars)
    quiet = _Writer()
    tlog.write_extra_scalars(
        _args("--no-log-loss-scale-to-tensorboard"), quiet, 3, {"loss_scale": 2.0}
    )
    assert quiet.scalars == {}
    tlog.write_validation_ppl(_args(), quiet, 3, {"lm loss": 2.0})
    assert quiet.scalars == {}  # only with --log-validation-ppl-to-tensorboard
    tlog.write_validation_ppl(
        _args("--log-validation-ppl-to-tensorboard"), quiet, 3, {"lm loss": 2.0}
    )
    assert quiet.scalars["lm loss validation ppl"][0] == pytest.approx(7.389056, rel=1e-6)


def test_manual_gc_restores_the_collector():
    import gc

    from gigatron.training._memory import ManualGC

    assert gc.isenabled()
    mgc = ManualGC(_args("--manual-gc", "--manual-gc-interval", "3"))
    try:
        assert not gc.isenabled() and mgc.collections == 1
        for it in range(1, 7):
            mgc.after_step(it)
        assert mgc.collections == 3  # start, iterations 3 and 6
        mgc.around_evaluation()
        assert mgc.collections == 4
    finally:
        mgc.close()
    assert gc.isenabled()
    off = ManualGC(_args("--manual-gc", "--no-manual-gc-eval"))
    off.after_step(5)
    off.around_evaluation()
    off.close()
    assert off.collections == 1 and gc.isenabled()  # interval 0: never between steps
    assert ManualGC(_args()).collections == 0 and gc.isenabled()


def test_flags_reach_the_core_configs():
    """The compat flags with numerics land in TransformerConfig / OptimizerConfig."""
    from gigatron.training import _config_from_args as cfa

    args = _args(
        *"--num-experts 4 --moe-router-score-function sigmoid --moe-router-dtype fp32".split(),
        *"--moe-router-topk-scaling-factor 2.5 --moe-router-enable-expert-bias".split(),
        *"--moe-router-bias-update-rate 0.01 --moe-expert-capacity-factor 1.5".split(),
        *"--moe-pad-expert-input-to-capacity --moe-token-drop-policy position".split(),
        *"--apply-query-key-layer-scaling --apply-layernorm-1p --squared-relu".split(),
        *"--attention-backend unfused --recompute-activations --fp16 --hysteresis 5".split(),
        *"--loss-scale-window 50 --min-loss-scale 0.5 --moe-input-jitter-eps 0.01".split(),
    )
    cfg = cfa.core_transformer_config_from_args(args)
    assert cfg.moe_router_score_function == "sigmoid" and cfg.moe_router_dtype == "fp32"
    assert cfg.moe_router_topk_scaling_factor == 2.5 and cfg.moe_router_enable_expert_bias
    assert cfg.moe_router_bias_update_rate == 0.01 and cfg.moe_input_jitter_eps == 0.01
    assert cfg.moe_expert_capacity_factor == 1.5 and cfg.moe_pad_expert_input_to_capacity
    assert cfg.moe_token_drop_policy == "position"
    assert cfg.apply_query_key_layer_scaling and cfg.attention_softmax_in_fp32
    assert cfg.layernorm_zero_centered_gamma
    x = torch.tensor([-2.0, 0.5, 3.0])
    torch.testing.assert_close(cfg.activation_func(x), torch.tensor([0.0, 0.25, 9.0]))
    assert cfg.attention_backend == AttnBackend.unfused
    assert cfg.recompute_granularity == "selective"
    opt = cfa.optimizer_config_from_args(args)
    assert (opt.hysteresis, opt.loss_scale_window, opt.min_loss_scale) == (5, 50, 0.5)


def test_tokenizer_types_accepted_are_the_ones_built():
    """Every accepted --tokenizer-type has a branch in build_tokenizer (the list cannot drift)."""
    import inspect

    from gigatron.training.compat_flags import TOKENIZER_TYPES
    from gigatron.training.tokenizer import tokenizer

    source = inspect.getsource(tokenizer.build_tokenizer)
    for kind in TOKENIZER_TYPES:
        assert f'kind == "{kind}"' in source, kind
        assert _args("--tokenizer-type", kind).tokenizer_type == kind


def test_deterministic_mode_on_nccl_takes_a_fixed_algorithm(monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    args = _args("--deterministic-mode", "--distributed-backend", "nccl")
    assert args.deterministic_mode
    assert not _args().deterministic_mode
