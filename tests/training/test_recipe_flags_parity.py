"""Megatron's recipe flags through pretrain_gpt, each against the one-process run (fp32, 1e-5):
--recompute-modules (every module name, dense and MoE, MLA) and --decoupled-lr /
--decoupled-min-lr at TP 2 and PP 2; losses and gradient norms of 3 steps. Also what the
decoupled LR does to the param groups, --step-batch-size-schedule's batches, and
--grad-reduce-in-bf16's buffers."""

import pytest

from gigatron.testing import run_distributed
from tests.training._gpt_runs import run_pretrain_gpt

pytestmark = pytest.mark.multirank

ARGS = [
    "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
    "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
    "--lr", "1e-2", "--min-lr", "1e-3", "--lr-decay-style", "cosine", "--train-iters", "3",
    "--mock-data", "--vocab-size", "100", "--make-vocab-size-divisible-by", "64",
    "--log-interval", "100", "--eval-interval", "1000", "--eval-iters", "1",
    "--no-progress-bar", "--num-workers", "0", "--hidden-dropout", "0",
    "--attention-dropout", "0", "--seed", "5", "--swiglu", "--disable-bias-linear",
    "--normalization", "RMSNorm", "--position-embedding-type", "rope",
]  # fmt: skip
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-grouped-gemm",
       "--moe-ffn-hidden-size", "32", "--moe-shared-expert-intermediate-size", "32",
       "--moe-aux-loss-coeff", "1e-2", "--moe-token-dispatcher-type", "alltoall"]  # fmt: skip
MLA = ["--multi-latent-attention", "--q-lora-rank", "16", "--kv-lora-rank", "16",
       "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "8"]  # fmt: skip
ALL_MODULES = ["--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp",
               "moe", "shared_experts", "moe_act", "layernorm", "mla_up_proj"]  # fmt: skip
TP2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]
PP2 = ["--pipeline-model-parallel-size", "2"]


def _run(extra):
    """(losses, grad norms) per iteration of one run; None off the last stage."""
    result = run_pretrain_gpt(ARGS + extra)
    hist = result["history"]
    return [h["losses"].get("lm loss") for h in hist], [h.get("grad_norm") for h in hist]


def _assert_close(got, want):
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        assert abs(a - b) <= 1e-5 * abs(b), (step, a, b)


def _last_stage(out):
    return next(r for r in reversed(out) if r[0][0] is not None)


@pytest.mark.parametrize(
    "model, modules",
    [
        ("dense", ["core_attn", "mlp", "layernorm"]),
        ("moe_mla", ["moe", "moe_act", "layernorm", "mla_up_proj", "core_attn"]),
        ("moe_shared", ["shared_experts", "moe_act", "mla_up_proj"]),
    ],
)
def test_recompute_modules_match_the_run_without_recompute(model, modules):
    base = [] if model == "dense" else MOE + MLA
    flags = ["--recompute-granularity", "selective", "--recompute-modules", *modules]
    ((ref_loss, ref_norm),) = run_distributed(_run, 1, args=(base,), timeout=180)
    for layout in (TP2, PP2):
        out = run_distributed(_run, 2, args=(base + flags + layout,), timeout=240)
        loss, norm = _last_stage(out)
        _assert_close(loss, ref_loss)
        _assert_close(norm, ref_norm)


def test_decoupled_lr_matches_one_rank_and_differs_from_plain():
    flags = ["--untie-embeddings-and-output-weights", "--decoupled-lr", "3e-2",
             "--decoupled-min-lr", "2e-3"]  # fmt: skip
    ((plain, _),) = run_distributed(_run, 1, args=(flags[:1],), timeout=180)
    ((ref_loss, ref_norm),) = run_distributed(_run, 1, args=(flags,), timeout=180)
    assert ref_loss[2] != plain[2]  # the embedding / output layer moved by another lr
    for layout in (TP2, PP2):
        loss, norm = _last_stage(run_distributed(_run, 2, args=(flags + layout,), timeout=240))
        _assert_close(loss, ref_loss)
        _assert_close(norm, ref_norm)


def _groups_and_lrs(extra):
    """[(is_decoupled_lr, max_lr, min_lr, lr after the run, names)] of the optimizer groups."""
    from gigatron.training import _config_from_args as cfa

    built = {}
    make = cfa.scheduler_from_args

    def capture(args, optimizer):
        built["opt"] = optimizer
        return make(args, optimizer)

    cfa.scheduler_from_args = capture
    try:
        result = run_pretrain_gpt(ARGS + extra)
    finally:
        cfa.scheduler_from_args = make
    names = {id(p): n for n, p in result["model"][0].named_parameters()}
    return [
        (g["is_decoupled_lr"], g["max_lr"], g["min_lr"], g["lr"],
         sorted(names[id(p)].split(".")[-2] for p in g["params"]))
        for g in built["opt"].param_groups
    ]  # fmt: skip


def test_decoupled_lr_drives_the_embedding_and_output_groups():
    import math

    flags = ["--untie-embeddings-and-output-weights", "--decoupled-lr", "3e-2",
             "--decoupled-min-lr", "2e-3", "--lr-warmup-iters", "0"]  # fmt: skip
    (groups,) = run_distributed(_groups_and_lrs, 1, args=(flags,), timeout=180)
    decoupled = [g for g in groups if g[0]]
    assert len(decoupled) == 1
    _, max_lr, min_lr, lr, names = decoupled[0]
    assert names == ["output_layer", "word_embeddings"]
    # cosine from 3e-2 to 2e-3 over 3 steps, read after step 3 (Megatron's formula)
    want = 2e-3 + 0.5 * (1 + math.cos(math.pi * 3 / 3)) * (3e-2 - 2e-3)
    assert (max_lr, min_lr) == (3e-2, 2e-3) and lr == pytest.approx(want)
    others = [g for g in groups if not g[0]]
    assert all(g[1] == 1e-2 and g[2] == 1e-3 for g in others)


def _without(argv, *flags):
    """argv less each flag in `flags` and its value."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        else:
            out.append(a)
    return out


def _batches(extra):
    from gigatron.training.global_vars import get_args

    argv = _without(ARGS, "--global-batch-size", "--train-iters") + extra
    result = run_pretrain_gpt(argv)
    return result["iteration"], get_args().consumed_train_samples


def test_step_batch_size_schedule_sets_each_steps_batch():
    # thresholds in tokens (seq 16): from 0 batch 2, from 64 tokens (4 samples) 4, from 128 (8) 8
    sched = ["--step-batch-size-schedule", "0:2 64:4 128:8"]
    (out,) = run_distributed(_batches, 1, args=(sched + ["--train-iters", "4"],), timeout=180)
    assert out == (4, 2 + 2 + 4 + 8)
    (out,) = run_distributed(_batches, 1, args=(sched + ["--train-samples", "16"],), timeout=180)
    assert out == (4, 16)  # Megatron's update_train_iters counts the same four steps


def test_step_batch_size_schedule_refuses_a_global_batch_size():
    from gigatron.training.arguments import parse_args, validate_args

    args = parse_args(argv=ARGS + ["--step-batch-size-schedule", "0:4"])
    with pytest.raises(ValueError, match="both --step-batch-size-schedule and --global-batch"):
        validate_args(args, 1)


def test_grad_reduce_in_bf16_keeps_bf16_buffers():
    from gigatron.training._config_from_args import ddp_config_from_args
    from gigatron.training.arguments import parse_args, validate_args

    def ddp(extra):
        args = parse_args(argv=ARGS + ["--bf16", *extra])
        validate_args(args, 1)
        return ddp_config_from_args(args).grad_reduce_in_fp32

    assert ddp([]) is True  # Megatron: bf16 reduces in fp32 by default
    assert ddp(["--grad-reduce-in-bf16"]) is False
    assert ddp(["--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"]) is False


def _forward_counts(extra):
    """{piece: forward calls in one 1-step run}: each recomputed piece runs twice per step."""
    from gigatron.training import pretrain_gpt

    counts = {}

    def count(name):
        def hook(*_):
            counts[name] = counts.get(name, 0) + 1

        return hook

    def provider(*args, **kwargs):
        model = pretrain_gpt.model_provider(*args, **kwargs)
        layer = model.decoder.layers[0]
        layer.mlp.register_forward_hook(count("moe"))
        layer.mlp.shared_experts.register_forward_hook(count("shared_experts"))
        layer.pre_mlp_layernorm.register_forward_hook(count("layernorm"))
        layer.self_attention.linear_kv_up_proj.register_forward_hook(count("mla_up_proj"))
        layer.self_attention.core_attention.register_forward_hook(count("core_attn"))
        experts = layer.mlp.experts
        act = experts._weighted_activation
        experts._weighted_activation = lambda *a: (count("moe_act")(), act(*a))[1]
        return model

    argv = _without(ARGS, "--train-iters", "--num-layers") + ["--train-iters", "1"]
    run_pretrain_gpt(
        argv + ["--num-layers", "1", "--eval-iters", "0"] + extra, model_provider=provider
    )
    return counts


def test_each_recompute_module_runs_its_piece_again_at_backward():
    base = MOE + MLA
    (plain,) = run_distributed(_forward_counts, 1, args=(base,), timeout=180)
    mbs = 2  # micro-batches per step: 4 / 2
    assert set(plain.values()) == {mbs}, plain
    for module in ("moe", "shared_experts", "layernorm", "mla_up_proj", "core_attn", "moe_act"):
        flags = ["--recompute-granularity", "selective", "--recompute-modules", module]
        (counts,) = run_distributed(_forward_counts, 1, args=(base + flags,), timeout=180)
        again = {k for k, v in counts.items() if v == 2 * mbs}
        # "moe" re-runs the whole MoE layer: its shared experts and activation with it
        inside = {"moe": {"moe", "shared_experts", "moe_act"}}.get(module, {module})
        assert again == inside, (module, counts)
