"""Megatron flags with real semantics, end to end through pretrain_gpt on gloo ranks:
--log-params-norm (hand norm, TP2 = one rank), the weight-decay schedule in the optimizer,
--manual-gc, --no-save-optim/--no-save-rng checkpoints and resume, --skip-train, and one long
Megatron-style command line run as a user would."""

import gc
import math
import os
import subprocess
import sys

import pytest
import torch

from gigatron.testing import run_distributed
from tests.training._gpt_runs import run_pretrain_gpt

pytestmark = pytest.mark.multirank


ARGS = [
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
    "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
    "--lr", "1e-2", "--mock-data", "--vocab-size", "100", "--make-vocab-size-divisible-by", "64",
    "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "1",
    "--no-progress-bar", "--num-workers", "0", "--hidden-dropout", "0",
    "--attention-dropout", "0", "--seed", "5",
]  # fmt: skip


def _pretrain(extra, forward_step=None):
    return run_pretrain_gpt(ARGS + extra, forward_step)


def _norm_wd_gc_run(extra):
    """(params norm per iteration, hand norm of the final weights, weight decay of the optimizer
    and the scheduler's formula after the run, gc state seen inside the loop, gc collections
    the run made, gc enabled after the run)."""
    from gigatron.training import _config_from_args as cfa
    from gigatron.training import pretrain_gpt

    built = {}
    make = cfa.scheduler_from_args

    def capture(args, optimizer):
        built["opt"], built["sched"] = optimizer, make(args, optimizer)
        return built["sched"]

    cfa.scheduler_from_args = capture
    seen_gc = []

    def forward_step(data_iterator, model):
        if model.training:  # the end-of-run validation runs after train() restored gc
            seen_gc.append(gc.isenabled())
        return pretrain_gpt.forward_step(data_iterator, model)

    collections = []

    def on_gc(phase, info):
        # only collections while the collector is off: the explicit ones inside train()
        if phase == "start" and info["generation"] == 2 and not gc.isenabled():
            collections.append(1)

    gc.callbacks.append(on_gc)
    try:
        result = _pretrain(extra, forward_step)
    finally:
        gc.callbacks.remove(on_gc)
        cfa.scheduler_from_args = make
    norms = [h["params_norm"] for h in result["history"]]
    # by hand: every element of the (unsharded on one rank) model once
    hand = math.sqrt(
        sum(p.detach().double().pow(2).sum().item() for p in result["model"][0].parameters())
    )
    wds = sorted({g["weight_decay"] for g in built["opt"].param_groups})
    return norms, hand, wds, built["sched"].get_wd(), seen_gc, len(collections), gc.isenabled()


WD = "--weight-decay-incr-style linear --start-weight-decay 0.0 --end-weight-decay 0.3".split()


def test_params_norm_weight_decay_schedule_and_manual_gc():
    """One rank: the logged params norm equals sqrt(sum p^2) of the final weights by hand; TP2
    and PP2 log the same norms (each element counted once over the model-parallel group). The
    optimizer's weight decay after 4 of 4 iterations is --end-weight-decay (Megatron: linear
    from start to end over train_iters x global batch), for the decayed group (the no-decay
    group stays 0).
    --manual-gc: the collector is off inside the loop, gc.collect() runs at the start and every
    2 iterations (1 + 2 collections in 4 iterations), and is back on after the run."""
    extra = ["--train-iters", "4", "--log-params-norm", "--manual-gc", "--manual-gc-interval", "2"]
    ((norms, hand, wds, sched_wd, seen_gc, n_gc, gc_after),) = run_distributed(
        _norm_wd_gc_run, 1, args=(extra + WD,), timeout=120
    )
    assert len(norms) == 4 and len(set(norms)) == 4  # one per iteration, the weights move
    assert norms[-1] == pytest.approx(hand, rel=1e-6)
    assert sched_wd == pytest.approx(0.3) and max(wds) == pytest.approx(0.3)
    assert seen_gc and not any(seen_gc)
    assert n_gc == 3
    assert gc_after
    for layout in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size"):
        # TP2: replicated params (norms, biases) once; PP2: the tied output weight not twice
        out = run_distributed(_norm_wd_gc_run, 2, args=(extra + WD + [layout, "2"],), timeout=120)
        for mp_norms, *_ in out:
            torch.testing.assert_close(
                torch.tensor(mp_norms), torch.tensor(norms), rtol=1e-5, atol=0
            )


def _ckpt_run(extra):
    from gigatron.core.dist_checkpointing.strategies.torch import read_dcp_metadata

    try:
        result = _pretrain(extra)
    except Exception as e:  # noqa: BLE001 - the message is what the test checks
        return {"error": f"{type(e).__name__}: {e}"}
    save = extra[extra.index("--save") + 1] if "--save" in extra else None
    keys = []
    if save:
        keys = sorted(read_dcp_metadata(os.path.join(save, "iter_0000002")).state_dict_metadata)
    return {
        "iteration": result["iteration"],
        "first": result["history"][0]["iteration"] if result["history"] else None,
        "weights": [p.detach().clone() for p in result["model"][0].parameters()],
        "keys": keys,
    }


def _ckpt_sequence(tmp):
    """The runs of the test below, one after the other in one process (no spawn per run)."""
    full, bare = os.path.join(tmp, "full"), os.path.join(tmp, "bare")
    two = ["--train-iters", "2"]
    no_load = ["--load", bare, "--no-load-optim", "--no-load-rng"]
    return {
        "ref": _ckpt_run(two + ["--save", full]),
        "saved": _ckpt_run(two + ["--save", bare, "--no-save-optim", "--no-save-rng"]),
        "err_optim": _ckpt_run(two + ["--load", bare]),
        "err_rng": _ckpt_run(two + ["--load", bare, "--no-load-optim"]),
        "loaded": _ckpt_run(two + no_load),
        "resumed": _ckpt_run(["--train-iters", "4"] + no_load),
    }


def test_no_save_optim_and_rng_checkpoint_contents_and_resume(tmp_path):
    """--no-save-optim --no-save-rng: the checkpoint holds the model only (no optimizer.*,
    opt_param_scheduler or rng_state keys; a default save has them). Resuming it without
    --no-load-optim is an error naming that flag (then --no-load-rng); with --no-load-optim
    --no-load-rng the weights are the saved ones and training continues at iteration 3."""
    (runs,) = run_distributed(_ckpt_sequence, 1, args=(str(tmp_path),), timeout=120)
    assert any(k.startswith("optimizer") for k in runs["ref"]["keys"])
    assert any(k.startswith("rng_state") for k in runs["ref"]["keys"])
    saved = runs["saved"]
    assert saved["keys"] and not any(
        k.startswith(("optimizer", "rng_state", "opt_param_scheduler")) for k in saved["keys"]
    ), saved["keys"]
    assert "--no-load-optim" in runs["err_optim"]["error"]
    assert "--no-load-rng" in runs["err_rng"]["error"]
    loaded = runs["loaded"]
    assert loaded["iteration"] == 2 and loaded["first"] is None  # nothing left to train
    for a, b in zip(loaded["weights"], saved["weights"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert runs["resumed"]["iteration"] == 4 and runs["resumed"]["first"] == 3


def _skip_train(extra):
    from gigatron.training import pretrain_gpt

    calls = []

    def forward_step(data_iterator, model):
        calls.append((model.training, torch.is_grad_enabled()))
        return pretrain_gpt.forward_step(data_iterator, model)

    result = _pretrain(extra, forward_step)
    weights = [p.detach().clone() for p in result["model"][0].parameters()]
    return result["iteration"], result.get("valid"), result.get("test"), calls, weights


def test_skip_train_evaluates_only():
    """--skip-train: no training step (every forward in eval mode without autograd, the weights
    are the initial ones of a 0-step reference), one validation and one test evaluation of
    --eval-iters 2 iterations x 2 microbatches each = 8 forwards, losses returned."""
    extra = ["--train-iters", "5", "--skip-train", "--eval-iters", "2"]
    ((iteration, valid, test, calls, weights),) = run_distributed(_skip_train, 1, args=(extra,))
    assert iteration == 0
    assert calls == [(False, False)] * 8
    assert valid["lm loss"] > 0 and test["lm loss"] > 0 and valid != test
    ref = ["--train-iters", "5", "--skip-train", "--eval-iters", "0"]
    ((_, none_valid, _, ref_calls, ref_weights),) = run_distributed(_skip_train, 1, args=(ref,))
    assert none_valid is None and ref_calls == []
    for a, b in zip(weights, ref_weights, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_long_megatron_command_line_end_to_end(tmp_path):
    """The docs/training.md command line (many Megatron flags together) as a subprocess: it
    trains 6 iterations, logs params norm, validates and saves without RNG state."""
    save = tmp_path / "ckpt"
    argv = f"""
      --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16
      --max-position-embeddings 16 --attention-backend auto --use-mcore-models
      --transformer-impl local --no-masked-softmax-fusion --no-bias-gelu-fusion
      --no-bias-dropout-fusion --no-persist-layer-norm --attention-softmax-in-fp32
      --no-async-tensor-model-parallel-allreduce --no-gradient-accumulation-fusion
      --micro-batch-size 2 --global-batch-size 4 --train-iters 6 --lr 6e-4 --min-lr 6e-5
      --lr-decay-style cosine --lr-warmup-fraction 0.1 --lr-decay-iters 6
      --weight-decay 0.1 --start-weight-decay 0.01 --end-weight-decay 0.1
      --weight-decay-incr-style linear --adam-beta1 0.9 --adam-beta2 0.95
      --init-method-std 0.006 --clip-grad 1.0 --seed 1234
      --manual-gc --manual-gc-interval 2 --empty-unused-memory-level 1
      --check-for-nan-in-loss-and-grad --mock-data --tokenizer-type NullTokenizer --vocab-size 100
      --num-workers 0 --data-cache-path {tmp_path / "cache"} --split 949,50,1
      --distributed-backend gloo --save {save} --save-interval 3 --ckpt-format torch_dist
      --use-dist-ckpt --no-save-rng --log-interval 2 --eval-interval 3 --eval-iters 1
      --log-params-norm --log-throughput --timing-log-level 0 --log-timers-to-tensorboard
      --log-validation-ppl-to-tensorboard --log-memory-to-tensorboard --no-progress-bar
    """.split()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run(
        [sys.executable, "-m", "gigatron.training.pretrain_gpt", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("iteration")]
    assert len(lines) == 3 and all("params norm:" in ln for ln in lines)
    assert "validation loss at iteration 6" in proc.stdout
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == "6"


def _one_spec_provider(pre_process=True, post_process=True, vp_stage=None):
    """A provider building every layer from one MoE layer spec (ignores --moe-layer-freq)."""
    from gigatron.core.models.gpt import GPTModel
    from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_fast_spec
    from gigatron.training import _pretrain_common as common
    from gigatron.training._config_from_args import core_transformer_config_from_args
    from gigatron.training.global_vars import get_args

    args = get_args()
    config = core_transformer_config_from_args(args)
    spec = get_gpt_layer_fast_spec(num_experts=args.num_experts)
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        **common.language_model_kwargs(args, pre_process, post_process),
        vp_stage=vp_stage,
    )


def _moe_freq_run(extra, block_spec):
    from gigatron.core.transformer.moe.moe_layer import MoELayer

    provider = None if block_spec else _one_spec_provider
    try:
        result = run_pretrain_gpt(ARGS + extra, model_provider=provider)
    except ValueError as e:
        return str(e)
    layers = result["model"][0].module.decoder.layers
    return [isinstance(layer.mlp, MoELayer) for layer in layers]


def test_moe_layer_freq_is_honoured_or_refused():
    """--moe-layer-freq 2 on 4 layers: a provider building every layer from one MoE spec is
    refused naming the flag; pretrain_gpt's (the decoder block spec, as Megatron's) trains with
    experts in layers 0 and 2 only."""
    extra = "--train-iters 1 --num-layers 4 --num-experts 2 --moe-layer-freq 2".split()
    ((refused, built),) = [
        [run_distributed(_moe_freq_run, 1, args=(extra, b), timeout=120)[0] for b in (0, 1)]
    ]
    assert "--moe-layer-freq 2" in refused and "get_gpt_decoder_block_spec" in refused
    assert built == [True, False, True, False]


def _deterministic_run():
    from gigatron.training.global_vars import get_args

    result = _pretrain(["--train-iters", "3", "--deterministic-mode"])
    config = result["model"][0].config
    return (
        get_args().deterministic_mode,
        config.deterministic_mode,
        (torch.are_deterministic_algorithms_enabled()),
    )


def test_deterministic_mode_reaches_torch_and_the_config():
    """--deterministic-mode (Megatron's): torch.use_deterministic_algorithms(True) in the
    process and TransformerConfig.deterministic_mode (the embedding's deterministic lookup)."""
    assert run_distributed(_deterministic_run, 1, timeout=120) == [(True, True, True)]
