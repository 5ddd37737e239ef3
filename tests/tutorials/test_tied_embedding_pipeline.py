"""A hand-built pipeline (PP 2, gloo ranks) with `share_embeddings_and_output_weights=True`: the
first stage's word embedding and the last stage's output-layer copy of it take the same steps
only when their gradients are summed over the embedding group (finalize_model_grads, with or
without DistributedDataParallel). Done wrong (plain torch Adam, no finalize) the schedule warns
at the first step where the copies differ and the save names the tied weights as the cause."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed as dist

from gigatron.core import dist_checkpointing, parallel_state
from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from gigatron.core.distributed.finalize_model_grads import finalize_model_grads
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from gigatron.core.pipeline_parallel.schedules import get_forward_backward_func
from gigatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank

SEQ, MB, VOCAB = 8, 2, 32


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _forward_step(data_iterator, model):
    tokens = next(data_iterator)
    loss = model(tokens, torch.arange(SEQ).expand(MB, -1), None, labels=tokens)
    return loss, lambda out: (out.float().mean(), {"lm loss": out.float().mean().detach()})


def _tied_copy() -> torch.Tensor:
    """This stage's copy: the word embedding (stage 0) or the output weight (stage 1)."""
    return _MODEL.shared_embedding_or_output_weight().detach().clone()


_MODEL = None


def _train(how: str, ckpt: str, steps: int = 3) -> dict:
    global _MODEL
    torch.set_num_threads(1)
    lines = _Lines()
    logging.getLogger("gigatron").addHandler(lines)
    parallel_state.initialize_model_parallel(1, 2)
    torch.manual_seed(1234)
    model_parallel_cuda_manual_seed(1234)
    config = TransformerConfig(
        num_layers=2, hidden_size=16, num_attention_heads=4, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, pipeline_dtype=torch.float32,
        pipeline_model_parallel_size=2,
    )  # fmt: skip
    model = _MODEL = GPTModel(
        config, get_gpt_layer_local_spec(), VOCAB, SEQ, share_embeddings_and_output_weights=True,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
    )  # fmt: skip
    if how == "ddp":
        ddp_config = DistributedDataParallelConfig(overlap_grad_reduce=False)
        chunk = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
        optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-2), [chunk])
    else:
        chunk, optimizer = model, torch.optim.Adam(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, VOCAB, (MB, SEQ), generator=torch.Generator().manual_seed(0))
    for _ in range(steps):
        optimizer.zero_grad()
        if how == "ddp":
            chunk.zero_grad_buffer()
        get_forward_backward_func()(
            forward_step_func=_forward_step, data_iterator=iter([tokens]), model=chunk,
            num_microbatches=1, seq_length=SEQ, micro_batch_size=MB,
        )  # fmt: skip
        if how != "plain_adam":
            finalize_model_grads([chunk])
        optimizer.step()
    copies = [torch.empty(0)] * 2
    dist.all_gather_object(copies, _tied_copy())
    result = {"equal": torch.equal(copies[0], copies[1]), "warnings": lines.lines}
    try:
        dist_checkpointing.save(model.sharded_state_dict(), ckpt)
        result["save"] = "saved"
    except Exception as err:  # the point: what the learner reads
        result["save"] = f"{type(err).__name__}: {err}"
    parallel_state.destroy_model_parallel()
    return result


def _ckpt(tmp_path) -> str:
    path = tmp_path / "ckpt"
    path.mkdir()
    return str(path)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["ddp", "bare_module_finalize"])
def test_summed_tied_grads_keep_the_copies_equal_and_save(tmp_path, how):
    results = run_distributed(_train, 2, args=(how, _ckpt(tmp_path)))
    for rank, result in enumerate(results):
        assert result["equal"], (rank, result)
        assert result["save"] == "saved", (rank, result)
        assert not any("tied" in line for line in result["warnings"]), (rank, result)


@pytest.mark.timeout(120)
def test_plain_adam_without_finalize_warns_and_the_save_names_the_tied_weights(tmp_path):
    results = run_distributed(_train, 2, args=("plain_adam", _ckpt(tmp_path)))
    assert not results[0]["equal"]
    for result in results:
        message = result["save"]
        assert message.startswith("CheckpointingException:"), message
        words = (
            "'embedding.word_embeddings.weight'",
            "share_embeddings_and_output_weights",
            "finalize_model_grads",
            "DistributedDataParallel",
            "embedding group",
        )
        for word in words:
            assert word in message, (word, message)
        assert "random states" not in message, message
    # one line, from the first stage, at the first step the copies differ (step 2)
    (warning,) = [line for line in results[0]["warnings"] if "tied" in line]
    assert "\n" not in warning
    for word in ("after 1 training step", "finalize_model_grads", "ranks [0, 1]"):
        assert word in warning, (word, warning)
    assert not any("tied" in line for line in results[1]["warnings"])


def _finalize_bare_module_over_dp():
    parallel_state.initialize_model_parallel(1, 1)
    model = torch.nn.Linear(2, 2)
    model(torch.ones(1, 2)).sum().backward()
    try:
        finalize_model_grads([model])
        return "no error"
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    finally:
        parallel_state.destroy_model_parallel()


@pytest.mark.timeout(60)
def test_finalize_of_a_bare_module_with_data_parallel_copies_says_to_wrap_it():
    for message in run_distributed(_finalize_bare_module_over_dp, 2):
        assert message.startswith("ValueError:") and "\n" not in message, message
        for word in ("Linear", "DistributedDataParallel", "data-parallel size is 2"):
            assert word in message, (word, message)
