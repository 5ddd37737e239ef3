"""pretrain_gpt on a tiny mock-data GPT, as the training tests run it on their spawned ranks."""

ARGS = [
    "--num-layers",
    "2",
    "--hidden-size",
    "32",
    "--num-attention-heads",
    "4",
    "--seq-length",
    "16",
    "--micro-batch-size",
    "2",
    "--global-batch-size",
    "8",
    "--lr",
    "1e-3",
    "--mock-data",
    "--vocab-size",
    "100",
    "--make-vocab-size-divisible-by",
    "64",
    "--log-interval",
    "100",
    "--eval-interval",
    "1000",
    "--eval-iters",
    "1",
    "--no-progress-bar",
    "--num-workers",
    "0",
    "--hidden-dropout",
    "0",
    "--attention-dropout",
    "0",
]


def reset_globals():
    """Undo what a previous `pretrain` call in this process set up (a rank runs several)."""
    from gigatron.core import parallel_state as ps
    from gigatron.core.num_microbatches_calculator import unset_num_microbatches_calculator
    from gigatron.training import global_vars

    unset_num_microbatches_calculator()
    global_vars.destroy_global_vars()
    ps.destroy_model_parallel()


def run_pretrain_gpt(argv: list[str], forward_step=None, *, model_provider=None) -> dict:
    """`pretrain` with pretrain_gpt's providers (`forward_step` / `model_provider` in place of its
    own when given), from fresh globals; returns pretrain's result."""
    from gigatron.training import pretrain_gpt
    from gigatron.training.training import pretrain

    reset_globals()
    return pretrain(
        pretrain_gpt.train_valid_test_datasets_provider,
        model_provider or pretrain_gpt.model_provider,
        None,
        forward_step or pretrain_gpt.forward_step,
        argv=argv,
    )
