"""pretrain_gpt on a tiny mock-data GPT, as the training tests run it on their spawned ranks."""

import contextlib

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


# Documents of the mock corpus in these runs. Megatron's MockGPTLowLevelDataset has 100,000 of up
# to 4,096 tokens: at --seq-length 16 every rank builds and shuffles ~12.8M sample indices per
# run (3-10 s of CPU) for runs that read a few dozen samples. The full-size corpus is built by
# tests/core/datasets/test_gpt_dataset.py and by the `gigatron train --mock-data` runs.
MOCK_DOCUMENTS = 1000


@contextlib.contextmanager
def small_mock_corpus(documents: int | None = MOCK_DOCUMENTS):
    """`--mock-data` reads a corpus of `documents` mock documents inside the block (None:
    Megatron's 100,000)."""
    from gigatron.core.datasets.gpt_dataset import MockGPTLowLevelDataset

    size = MockGPTLowLevelDataset.size
    MockGPTLowLevelDataset.size = size if documents is None else documents
    try:
        yield
    finally:
        MockGPTLowLevelDataset.size = size


def run_pretrain_gpt(
    argv: list[str],
    forward_step=None,
    *,
    model_provider=None,
    mock_documents: int | None = MOCK_DOCUMENTS,
) -> dict:
    """`pretrain` with pretrain_gpt's providers (`forward_step` / `model_provider` in place of its
    own when given), from fresh globals, on a `small_mock_corpus(mock_documents)`; returns
    pretrain's result."""
    from gigatron.training import pretrain_gpt
    from gigatron.training.training import pretrain

    reset_globals()
    with small_mock_corpus(mock_documents):
        return pretrain(
            pretrain_gpt.train_valid_test_datasets_provider,
            model_provider or pretrain_gpt.model_provider,
            None,
            forward_step or pretrain_gpt.forward_step,
            argv=argv,
        )
