"""The training loop on gloo ranks: NaN handling, layouts against one rank, resume."""

import pytest
import torch
import torch.distributed as dist

from gigatron.testing import run_distributed
from tests.training._gpt_runs import ARGS, run_pretrain_gpt

pytestmark = pytest.mark.multirank


def _train_with_nan(
    skip: bool, nan_rank: int, nan_iteration: int, clip: str = "1.0", extra: tuple = ()
):
    from gigatron.training import _train_step, pretrain_gpt
    from gigatron.training.global_vars import get_args
    from gigatron.training.training import NonFiniteGradientError

    snapshots = {}
    scans = []  # calls of the grad-buffer scan: with clipping only on the bad step
    scan = _train_step._nonfinite_grad_ranks
    _train_step._nonfinite_grad_ranks = lambda model: scans.append(1) or scan(model)

    def forward_step(data_iterator, model):
        args = get_args()
        output, loss_func = pretrain_gpt.forward_step(data_iterator, model)
        if args.iteration + 1 == nan_iteration:
            snapshots.setdefault("before", [p.detach().clone() for p in model.parameters()])
            if dist.get_rank() == nan_rank:
                output = output * float("nan")
        if args.iteration + 1 == nan_iteration + 1:
            snapshots.setdefault("after", [p.detach().clone() for p in model.parameters()])
        return output, loss_func

    argv = ARGS + ["--train-iters", "5", "--clip-grad", clip, *extra]
    argv += ["--skip-nan-steps"] if skip else []
    try:
        result = run_pretrain_gpt(argv, forward_step)
    except NonFiniteGradientError as e:
        return str(e), len(scans)
    finally:
        _train_step._nonfinite_grad_ranks = scan
    history = result["history"]
    unchanged = all(torch.equal(a, b) for a, b in zip(snapshots["before"], snapshots["after"]))
    return (
        [h["skipped"] for h in history],
        [h["nan"] for h in history],
        result["iteration"],
        unchanged,
        len(scans),
    )


# clip 1.0: the check is the clipping norm's (the buffers are scanned only to name the ranks of
# a bad step); clip 0: one scan before every step
@pytest.mark.parametrize("clip, scans", [("1.0", 1), ("0", 5)])
def test_injected_nan_is_skipped_on_every_rank(clip, scans):
    out = run_distributed(_train_with_nan, 2, args=(True, 1, 3, clip), timeout=240)
    for skipped, nans, iteration, unchanged, n_scans in out:
        assert unchanged, "the skipped step changed the weights"
        assert skipped == [0, 0, 1, 0, 0]
        assert nans == [0, 0, 1, 0, 0]
        assert iteration == 5
        assert n_scans == scans


@pytest.mark.parametrize("clip, scans", [("1.0", 1), ("0", 2)])
def test_injected_nan_stops_every_rank_naming_the_step(clip, scans):
    out = run_distributed(_train_with_nan, 2, args=(False, 1, 2, clip), timeout=240)
    for message, n_scans in out:
        # the NaN spreads to both ranks through the DP all-reduce of the grads
        assert "non-finite gradient at iteration 2 on ranks [0, 1]" in message
        assert "--skip-nan-steps" in message
        assert n_scans == scans


def test_nan_under_a_constant_loss_scale_stops_the_run(precision="--fp16"):
    """Only dynamic fp16 loss scaling treats NaN/Inf grads as an overflow to skip (Megatron turns
    its NaN check off there alone); under a constant --loss-scale the loss scaler's check finds
    the NaN and the run stops as without a scaler."""
    args = (False, 1, 2, "1.0", (precision, "--loss-scale", "1024"))
    for message, n_scans in run_distributed(_train_with_nan, 2, args=args, timeout=240):
        assert "non-finite gradient at iteration 2 on ranks [0, 1]" in message, message
        assert n_scans == 1


def test_no_check_for_nan_in_loss_and_grad_steps_without_the_check():
    """Megatron's --no-check-for-nan-in-loss-and-grad: no check, no scan, the step is taken."""
    args = (False, 1, 3, "1.0", ("--no-check-for-nan-in-loss-and-grad",))
    for skipped, nans, iteration, unchanged, n_scans in run_distributed(
        _train_with_nan, 2, args=args, timeout=240
    ):
        assert skipped == nans == [0] * 5 and iteration == 5
        assert not unchanged and n_scans == 0  # the NaN update was applied


def test_nan_loss_under_dynamic_fp16_scaling_is_a_skipped_nan_iteration():
    """Dynamic fp16 scaling: a NaN loss is skipped on every rank like an overflow (the run goes
    on, the weights stay) and, as in Megatron's log, counted as a NaN iteration."""
    args = (False, 1, 3, "1.0", ("--fp16", "--initial-loss-scale", "4096"))
    for skipped, nans, iteration, unchanged, n_scans in run_distributed(
        _train_with_nan, 2, args=args, timeout=240
    ):
        assert skipped == [0, 0, 1, 0, 0] and nans == [0, 0, 1, 0, 0]
        assert unchanged and iteration == 5 and n_scans == 0


def _train_with_replicated_grad_nan():
    """TP = 2, no sequence parallelism: a NaN put into a layernorm weight's grad (replicated over
    TP, never reduced over it) on TP rank 1 at iteration 2, after backward."""
    from gigatron.training import _train_step
    from gigatron.training.global_vars import get_args
    from gigatron.training.training import NonFiniteGradientError

    step = _train_step._optimizer_step

    def poisoned_step(optimizer, model, args):
        if args.iteration + 1 == 2 and dist.get_rank() == 1:
            (param,) = [
                p
                for n, p in model[0].named_parameters()
                if n.endswith("layers.0.input_layernorm.weight")
            ]
            assert not getattr(param, "tensor_model_parallel", False)
            param.main_grad.view(-1)[0] = float("nan")
        return step(optimizer, model, args)

    _train_step._optimizer_step = poisoned_step
    argv = ARGS + ["--train-iters", "4", "--tensor-model-parallel-size", "2", "--clip-grad", "1.0"]
    try:
        run_pretrain_gpt(argv)
    except NonFiniteGradientError as e:
        return str(e), get_args().iteration
    finally:
        _train_step._optimizer_step = step
    return "no error", get_args().iteration


def test_nan_in_a_tp_replicated_grad_is_caught_in_its_iteration():
    """The clipping norm leaves TP replicas on TP rank > 0 out; the check still sees their NaN
    (0 x their norm joins the sum), in the same iteration and naming the rank."""
    for message, _ in run_distributed(_train_with_replicated_grad_nan, 2, timeout=240):
        assert "non-finite gradient at iteration 2 on ranks [1]" in message, message


def _train_fp16():
    result = run_pretrain_gpt(
        ARGS + ["--train-iters", "12", "--fp16", "--initial-loss-scale", "4194304"]
    )
    history = result["history"]
    return [h["skipped"] for h in history], [h["nan"] for h in history], result["iteration"]


def test_fp16_loss_scale_overflow_skips_the_step_and_backs_off():
    """fp16 with dynamic loss scaling: the first steps overflow (scale 2^22); the scaler skips
    them on every rank and halves the scale until the grads fit, as Megatron (the NaN/Inf check
    used to stop the run at iteration 1)."""
    for skipped, nans, iteration in run_distributed(_train_fp16, 2, timeout=240):
        assert iteration == 12
        assert nans == [0] * 12
        assert skipped[0] == 1 and 0 < sum(skipped) < 12
        assert skipped[-1] == 0


def _losses(extra):
    result = run_pretrain_gpt(ARGS + ["--train-iters", "8", "--seed", "5"] + extra)
    losses = [h["losses"].get("lm loss") for h in result["history"]]
    # the loop reads the device losses only when it logs (every 100 here) and once at the end
    assert all(isinstance(x, float) for x in losses if x is not None)
    return losses


def test_tp2_pp2_matches_one_rank_step_by_step():
    """Same flags on 1 rank and on TP2 x PP2 (4 ranks): the loss of each of 8 steps agrees."""
    (reference,) = run_distributed(_losses, 1, args=([],), timeout=300)
    layout = run_distributed(
        _losses,
        4,
        args=(["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"],),
        timeout=300,
    )
    last_stage = [r for r in layout if r[0] is not None]
    assert len(last_stage) == 2  # both TP ranks of the last stage report the loss
    assert len(reference) == 8 and reference[-1] < reference[0]
    for losses in last_stage:
        for step, (a, b) in enumerate(zip(losses, reference, strict=True)):
            assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (step, a, b)


def _run_with_sigterm(ckpt_dir, kill_at, load, dropout=0.0):
    import os
    import signal

    from gigatron.training import pretrain_gpt
    from gigatron.training.global_vars import get_args

    def forward_step(data_iterator, model):
        args = get_args()
        if kill_at and args.iteration + 1 == kill_at and dist.get_rank() == 0:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only records it
        return pretrain_gpt.forward_step(data_iterator, model)

    extra = ["--train-iters", "12", "--seed", "3", "--use-distributed-optimizer"]
    extra += ["--hidden-dropout", str(dropout), "--attention-dropout", str(dropout)]
    if ckpt_dir:
        extra += ["--save", ckpt_dir, "--exit-signal-handler"]
    if load:
        extra += ["--load", ckpt_dir]
    result = run_pretrain_gpt(ARGS + extra, forward_step)
    weights = [p.detach().clone() for p in result["model"][0].parameters()]
    return result["iteration"], [h["losses"]["lm loss"] for h in result["history"]], weights


def test_sigterm_saves_and_resume_matches_uninterrupted(tmp_path, dropout=0.1):
    """With dropout the resumed run must draw the same masks: the RNG states are restored at
    load, and nothing built afterwards (the data loader) may move them. (Dropout on only: a
    resume without dropout checks a subset of what this one does, bitwise.)"""
    ckpt = str(tmp_path / "ckpt")
    full = run_distributed(_run_with_sigterm, 2, args=(None, 0, False, dropout), timeout=300)
    first = run_distributed(_run_with_sigterm, 2, args=(ckpt, 5, False, dropout), timeout=300)
    assert [r[0] for r in first] == [5, 5]  # every rank stopped after the signalled step
    second = run_distributed(_run_with_sigterm, 2, args=(ckpt, 0, True, dropout), timeout=300)
    for rank in range(2):
        iteration, losses, weights = second[rank]
        assert iteration == 12
        assert first[rank][1] + losses == full[rank][1]  # bitwise equal loss curve
        for a, b in zip(weights, full[rank][2]):
            assert torch.equal(a, b)


def _train_with_tensorboard(tb_dir):
    run_pretrain_gpt(
        ARGS
        + ["--train-iters", "4", "--log-interval", "2", "--eval-interval", "2"]
        + ["--tensorboard-dir", tb_dir]
    )


def test_tensorboard_scalars(tmp_path):
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    run_distributed(_train_with_tensorboard, 2, args=(str(tmp_path),), timeout=240)
    acc = event_accumulator.EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"lm loss", "learning-rate", "grad-norm", "tokens-per-sec", "lm loss validation"} <= tags
    assert [e.step for e in acc.Scalars("lm loss")] == [2, 4]


def _train_with_duration_limit(ckpt):
    result = run_pretrain_gpt(
        ARGS + ["--train-iters", "50", "--exit-duration-in-mins", "0.00001", "--save", ckpt]
    )
    return result["iteration"]


def test_exit_duration_saves_and_stops(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    assert run_distributed(_train_with_duration_limit, 2, args=(ckpt,), timeout=240) == [1, 1]
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "1"


def _train_with_wandb(save_dir):
    import os

    os.environ["WANDB_MODE"] = "offline"  # no network: W&B writes its run files locally
    os.environ["WANDB_SILENT"] = "true"
    run_pretrain_gpt(
        ARGS
        + ["--train-iters", "4", "--log-interval", "2"]
        + ["--wandb-project", "gigatron-test", "--wandb-save-dir", save_dir]
    )
    import wandb

    run_dir = wandb.run.dir if wandb.run is not None else None
    if wandb.run is not None:
        wandb.finish()
    return run_dir


def test_wandb_offline_logging(tmp_path):
    pytest.importorskip("wandb")
    out = run_distributed(_train_with_wandb, 2, args=(str(tmp_path),), timeout=240)
    last = out[-1]  # the last rank logs
    assert last is not None and last.startswith(str(tmp_path))
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs and list(runs[0].glob("*.wandb"))


def _log_lines_and_history():
    import contextlib
    import io

    argv = [a for a in ARGS]
    argv[argv.index("--log-interval") + 1] = "5"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = run_pretrain_gpt(argv + ["--train-iters", "10", "--seed", "5"])
    logged = [
        float(line.split("lm loss: ")[1].split(" |")[0])
        for line in out.getvalue().splitlines()
        if "lm loss: " in line and "iteration" in line
    ]
    return logged, [h["losses"]["lm loss"] for h in result["history"]]


def test_log_line_reports_the_window_mean_loss():
    """As Megatron's log line: each loss averaged over the iterations since the last line."""
    ((logged, per_iteration),) = run_distributed(_log_lines_and_history, 1, timeout=300)
    assert len(logged) == 2 and len(per_iteration) == 10
    for window, value in enumerate(logged):
        mean = sum(per_iteration[5 * window : 5 * window + 5]) / 5
        assert abs(value - mean) <= 1e-6 * abs(mean), (window, value, mean)
        assert abs(value - per_iteration[5 * window + 4]) > 1e-4  # not the last iteration's


def _moe_run():
    moe = ["--num-experts", "2", "--moe-router-topk", "1", "--moe-aux-loss-coeff", "0.01"]
    result = run_pretrain_gpt(ARGS + ["--train-iters", "4", "--seed", "5"] + moe)
    return [h["losses"] for h in result["history"]]


def test_moe_aux_losses_reach_the_history_as_floats():
    """pretrain_gpt with MoE layers: the load-balancing loss of each iteration is in the history
    beside the LM loss, read (like it) when the loop logs, not each iteration."""
    for losses in run_distributed(_moe_run, 2, timeout=300):
        assert len(losses) == 4
        for entry in losses:
            assert set(entry) == {"lm loss", "load_balancing_loss"}, entry
            assert all(isinstance(v, float) for v in entry.values())
            assert entry["load_balancing_loss"] > 0.0


def _eval_microbatches_during_rampup():
    from gigatron.training import pretrain_gpt
    from gigatron.training.global_vars import get_args

    calls = []  # (iteration, training?) of every forward step

    def forward_step(data_iterator, model):
        calls.append((get_args().iteration, model.training))
        return pretrain_gpt.forward_step(data_iterator, model)

    argv = ARGS + ["--train-iters", "2", "--eval-interval", "1", "--eval-iters", "2"]
    argv += ["--rampup-batch-size", "4", "4", "16"]  # global batch 8: ramp 4 -> 8
    result = run_pretrain_gpt(argv, forward_step)
    evals = [it for it, training in calls if not training]
    trains = [it for it, training in calls if training]
    return evals, trains, get_args().consumed_valid_samples, result["iteration"]


def test_evaluation_reads_the_full_global_batch_during_rampup():
    """Megatron's eval_num_microbatches: global_batch_size / (micro_batch_size * dp) micro-batches
    per evaluation iteration whatever the ramp-up's current batch, matching the samples counted
    (it used the ramp-up's count: fewer samples read than counted, validation after a resume
    differed from an uninterrupted run)."""
    for evals, trains, consumed, iteration in run_distributed(
        _eval_microbatches_during_rampup, 2, timeout=240
    ):
        assert iteration == 2
        assert trains == [0, 1]  # both in the ramp-up: batch 4, one micro-batch per rank
        # every evaluation (after iterations 1 and 2, then Megatron's end-of-run validation and
        # test, eval-iters 2): 8 / (2 * 2) = 2 each; the test split counts as Megatron's does
        assert evals == [1] * 4 + [2] * 4 + [2] * 4 + [2] * 4, evals
        assert consumed == 4 * 2 * 8


def _train_sync_free(sync_free: bool, skip: bool, nan_iteration: int | None):
    from gigatron.training import pretrain_gpt
    from gigatron.training.global_vars import get_args
    from gigatron.training.training import NonFiniteGradientError

    def forward_step(data_iterator, model):
        output, loss_func = pretrain_gpt.forward_step(data_iterator, model)
        if get_args().iteration + 1 == nan_iteration and dist.get_rank() == 1:
            output = output * float("nan")
        return output, loss_func

    argv = ARGS + ["--train-iters", "6", "--log-interval", "3", "--bf16"]
    argv += ["--use-distributed-optimizer", "--accumulate-allreduce-grads-in-fp32"]
    argv += ["--skip-nan-steps"] if skip else []
    argv += ["--sync-free-step"] if sync_free else []
    try:
        result = run_pretrain_gpt(argv, forward_step)
    except NonFiniteGradientError as e:
        return str(e)
    history = result["history"]
    return (
        [h["losses"]["lm loss"] for h in history],
        [h["grad_norm"] for h in history],
        [h["skipped"] for h in history],
        [h["nan"] for h in history],
    )


def test_sync_free_step_trains_like_the_host_checked_step():
    """--sync-free-step (DP = 2, bf16, distributed optimizer): the same losses and grad
    norms as the default step to fp32 rounding (the fused kernel clips by dividing), all read as
    Python numbers by the time the loop returns."""
    host = run_distributed(_train_sync_free, 2, args=(False, False, None), timeout=240)
    free = run_distributed(_train_sync_free, 2, args=(True, False, None), timeout=240)
    for (losses_h, norms_h, _, _), (losses_f, norms_f, skipped, nans) in zip(host, free):
        assert all(isinstance(x, float) for x in losses_f + norms_f)
        assert skipped == nans == [0] * 6
        torch.testing.assert_close(losses_f, losses_h, rtol=1e-4, atol=0)
        torch.testing.assert_close(norms_f, norms_h, rtol=1e-3, atol=0)


def test_sync_free_step_skips_a_nan_step_on_the_device_and_reports_it_when_logging():
    for skipped, nans in [
        r[2:] for r in run_distributed(_train_sync_free, 2, args=(True, True, 2))
    ]:
        assert skipped == nans == [0, 1, 0, 0, 0, 0]
    for message in run_distributed(_train_sync_free, 2, args=(True, False, 2), timeout=240):
        assert "non-finite gradient at iteration 2 (--sync-free-step" in message
        assert "at iteration 3" in message  # found at the first log line after it
