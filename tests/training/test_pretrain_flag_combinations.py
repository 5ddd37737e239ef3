"""pretrain_gpt / pretrain_t5 flag combinations found broken by running the entry points as a
Megatron user would (QA audit, session 9): interleaved pipeline (virtual stages) trains on the same
micro-batches as one rank, --train-samples sets the iteration count (ramp-up included), T5
takes Megatron's --encoder-num-layers in place of --num-layers."""

import pytest

from gigatron.testing import run_distributed
from tests.training._gpt_runs import run_pretrain_gpt

pytestmark = pytest.mark.multirank


ARGS = [
    "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
    "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
    "--lr", "1e-3", "--mock-data", "--vocab-size", "100", "--make-vocab-size-divisible-by", "64",
    "--log-interval", "100", "--eval-interval", "2", "--eval-iters", "1",
    "--no-progress-bar", "--num-workers", "0", "--hidden-dropout", "0",
    "--attention-dropout", "0", "--seed", "5",
]  # fmt: skip


def _run(extra, **kwargs):
    """(per-iteration LM losses or None off the last stage, validation losses, iterations,
    consumed samples) of one pretrain_gpt run (`kwargs` to `run_pretrain_gpt`)."""
    from gigatron.training.global_vars import get_args

    result = run_pretrain_gpt(ARGS + extra, **kwargs)
    losses = [h["losses"].get("lm loss") for h in result["history"]]
    valid = result.get("valid", {}).get("lm loss")
    return losses, valid, result["iteration"], get_args().consumed_train_samples


def test_virtual_pipeline_trains_on_the_same_batches_as_one_rank():
    """PP2 x VPP2 (one layer per virtual stage) against one rank, step by step: each virtual
    stage must see the same micro-batches (a shared iterator gave the last stage the labels of
    other samples: loss 6.269 vs 6.223 at step 1 in the audit)."""
    iters = ["--train-iters", "3"]
    ((ref, ref_valid, _, _),) = run_distributed(_run, 1, args=(iters,), timeout=120)
    out = run_distributed(
        _run,
        2,
        args=(
            iters
            + [
                "--pipeline-model-parallel-size",
                "2",
                "--num-layers-per-virtual-pipeline-stage",
                "1",
            ],
        ),  # fmt: skip
        timeout=120,
    )
    losses, valid, iteration, consumed = out[1]  # the last stage reports the loss
    assert out[0][0] == [None] * 3
    assert iteration == 3 and consumed == 12  # one global batch per step, not one per chunk
    for step, (a, b) in enumerate(zip(losses, ref, strict=True)):
        assert abs(a - b) <= 1e-5 * abs(b), (step, a, b)
    assert abs(valid - ref_valid) <= 1e-5 * abs(ref_valid), (valid, ref_valid)


def test_train_samples_sets_the_iterations():
    """--train-samples 12 at global batch 4 is 3 iterations (it crashed comparing with None);
    with --rampup-batch-size 2 2 4 and global batch 4, Megatron's count: batches of 2, 2, 4
    while the consumed samples are <= 4, then (14 - 8) // 4 = 1 more, 4 iterations in all."""
    (plain,) = run_distributed(_run, 1, args=(["--train-samples", "12"],), timeout=120)
    assert plain[2] == 3 and plain[3] == 12 and len(plain[0]) == 3
    ramp = ["--train-samples", "14", "--rampup-batch-size", "2", "2", "4"]
    (ramped,) = run_distributed(_run, 1, args=(ramp,), timeout=120)
    assert ramped[2] == 4 and ramped[3] == 2 + 2 + 4 + 4, ramped[2:]


def _t5_with_encoder_flags(tmp):
    from tests.training._bert_t5_cases import corpus_args, train_history

    argv = corpus_args(
        tmp, 2, ["--encoder-seq-length", "32", "--decoder-seq-length", "16", "--lr", "1e-3"]
    )
    i = argv.index("--num-layers")
    argv = argv[:i] + argv[i + 2 :] + ["--encoder-num-layers", "2", "--decoder-num-layers", "1"]
    from gigatron.training.global_vars import get_args

    history = train_history("pretrain_t5", argv)
    args = get_args()
    return len(history), args.num_layers, args.seq_length


def test_t5_takes_megatrons_encoder_flags_without_num_layers(tmp_path):
    """Megatron's T5 scripts give --encoder-num-layers / --encoder-seq-length and no
    --num-layers / --seq-length ('--num-layers is required' before)."""
    (out,) = run_distributed(_t5_with_encoder_flags, 1, args=(str(tmp_path),), timeout=120)
    assert out == (2, 2, 32)


def _count_evaluations(extra):
    from gigatron.training import training

    calls = []
    evaluate = training.evaluate
    training.evaluate = lambda *a, **k: calls.append(1) or evaluate(*a, **k)
    try:
        _, valid, iteration, _ = _run(extra)
    finally:
        training.evaluate = evaluate
    return len(calls), valid, iteration


def test_eval_interval_zero_evaluates_at_the_end_and_eval_iters_zero_never():
    """--eval-interval 0 (no periodic evaluation, as the loop reads it) divided by zero while
    sizing the validation set; --eval-iters 0 ran empty evaluations and logged blank lines."""
    (at_end,) = run_distributed(
        _count_evaluations, 1, args=(["--train-iters", "3", "--eval-interval", "0"],), timeout=120
    )
    # the end of the run evaluates the validation then the test split (Megatron's do_valid, do_test)
    assert at_end[0] == 2 and at_end[1] is not None and at_end[2] == 3
    (never,) = run_distributed(
        _count_evaluations, 1, args=(["--train-iters", "3", "--eval-iters", "0"],), timeout=120
    )
    assert never == (0, None, 3)


def _masked_lm_with_mock_data(entry):
    import importlib

    import pytest

    argv = ARGS[:] + ["--train-iters", "1"]
    if entry == "pretrain_t5":
        argv += ["--decoder-seq-length", "8"]
    with pytest.raises(ValueError, match=f"--mock-data: {entry} has no mock dataset"):
        importlib.import_module(f"gigatron.training.{entry}").main(argv)
    return True


def test_bert_and_t5_refuse_mock_data_by_name():
    """--mock-data was accepted and ignored by pretrain_bert / pretrain_t5, which then failed
    inside the tokenizer ('_NullTokenizer has no vocab')."""
    for entry in ("pretrain_bert", "pretrain_t5"):
        assert run_distributed(_masked_lm_with_mock_data, 1, args=(entry,), timeout=120) == [True]


def _num_zeros(extra):
    from gigatron.training import training

    seen = []
    step = training.train_step
    training.train_step = lambda *a, **k: (lambda out: seen.append(out[3]) or out)(step(*a, **k))
    try:
        # Megatron's full mock corpus: on the 1,000-document one, iteration 2 counts 2308 zeros
        # under --use-distributed-optimizer and 2305 on one rank or plain DP 2
        _run(
            ["--train-iters", "2", "--untie-embeddings-and-output-weights"] + extra,
            mock_documents=None,
        )
    finally:
        training.train_step = step
    return [float(z) for z in seen]


def test_log_num_zeros_in_grad_counts_the_zero_gradient_entries():
    """Megatron's --log-num-zeros-in-grad was an unknown flag. Untied, the input embedding rows
    of tokens absent from the batch have zero gradients: at vocab 128 x hidden 32 with 64
    tokens drawn, thousands of zeros; DP = 2 counts the same as one rank."""
    (one,) = run_distributed(_num_zeros, 1, args=(["--log-num-zeros-in-grad"],), timeout=120)
    assert len(one) == 2 and all(z > 32 * 10 for z in one), one
    two = run_distributed(
        _num_zeros,
        2,
        args=(["--log-num-zeros-in-grad", "--use-distributed-optimizer"],),
        timeout=120,
    )
    assert two[0] == two[1] == one


def _moe_history(extra):
    losses, _, _, _ = _run(["--train-iters", "1", "--num-experts", "4", "--moe-router-topk", "2"]
                           + extra)  # fmt: skip
    from gigatron.training.global_vars import get_args

    return sorted(get_args().train_history[0]["losses"])


def test_moe_z_loss_and_sequence_balancing_reach_the_log():
    """--moe-z-loss-coeff / --moe-router-load-balancing-type seq_aux_loss train those losses:
    the tracker reports them beside the LM loss."""
    flags = ["--moe-z-loss-coeff", "1e-3", "--moe-router-load-balancing-type", "seq_aux_loss",
             "--moe-aux-loss-coeff", "1e-2"]  # fmt: skip
    (keys,) = run_distributed(_moe_history, 1, args=(flags,), timeout=120)
    assert keys == ["lm loss", "seq_load_balancing_loss", "z_loss"], keys
