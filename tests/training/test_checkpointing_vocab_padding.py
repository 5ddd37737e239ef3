"""Resharding a training checkpoint across a vocabulary-padding change (issue 28, item 5).

The padded vocabulary is a multiple of make_vocab_size_divisible_by x TP: 601 tokens (NullTokenizer
--vocab-size 600) pad to 768 rows at TP2 and 640 at TP1 with the default 128. Changing only the
layout keeps the checkpoint's rows (the padded rows' logits are in every softmax: dropping or adding
rows would move the loss), so a TP2 -> TP1 resume continues within 1e-6 of the run that kept TP2,
with the distributed optimizer switched on or off on the way. Changing the padding itself (another
--make-vocab-size-divisible-by) trims or zero-pads the rows of the weights and of the optimizer
state alike (Adam moments, fp32 main params of bf16 models, flat distributed-optimizer ranges), and
a resharded run continues within 1e-6 of the same padding change at the saved layout. A shape
change that is not the vocabulary's is an error naming the tensor, both shapes and the directory.
"""

import argparse

import pytest
import torch

from gigatron.core import dist_checkpointing as dc
from gigatron.testing import run_distributed
from gigatron.testing.distributed import DistributedTestError
from tests.training._gpt_runs import run_pretrain_gpt

pytestmark = pytest.mark.multirank


ARGS = [
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
    "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "2",
    "--global-batch-size", "4", "--lr", "1e-3", "--mock-data", "--vocab-size", "600",
    "--log-interval", "100", "--eval-interval", "1000", "--eval-iters", "0",
    "--no-progress-bar", "--num-workers", "0", "--hidden-dropout", "0",
    "--attention-dropout", "0", "--seed", "5",
]  # fmt: skip
TP2 = ["--tensor-model-parallel-size", "2"]
TP1_DIST = ["--tensor-model-parallel-size", "1", "--use-distributed-optimizer"]  # DP2


def _div(n):
    return ["--make-vocab-size-divisible-by", str(n)]


def _pretrain(extra):
    """(lm losses of this run, its padded vocabulary) of one pretrain_gpt run."""
    torch.set_num_threads(1)
    from gigatron.training import global_vars

    result = run_pretrain_gpt(ARGS + extra)
    losses = [h["losses"].get("lm loss") for h in result["history"]]
    return losses, global_vars.get_args().padded_vocab_size


def _run(extra, world=2):
    return run_distributed(_pretrain, world, args=(extra,), timeout=300)[0]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Two checkpoints at iteration 2: TP2 plain Adam (768 rows), TP1 x DP2 distributed (640)."""
    root = tmp_path_factory.mktemp("vocab_padding")
    out = {}
    for name, layout, rows in (("tp2", TP2, 768), ("tp1", TP1_DIST, 640)):
        path = str(root / name)
        _, padded = _run(layout + ["--train-iters", "2", "--save", path, "--save-interval", "2"])
        assert padded == rows
        out[name] = path
    return out


def _resume(path, layout):  # 2 more steps on the saved 2-step schedule
    flags = ["--train-iters", "4", "--load", path, "--use-checkpoint-opt_param-scheduler"]
    return _run(layout + flags)


CASES = {
    # name: (checkpoint, original layout, other layout, padded rows both resume with)
    "tp2_to_tp1": ("tp2", TP2, TP1_DIST, 768),  # default padding: the saved 768 rows are kept
    "tp1_to_tp2": ("tp1", TP1_DIST, TP2, 640),  # 640 rows split 320 / 320
    "trim_768_to_640": ("tp2", TP2 + _div(64), TP1_DIST + _div(64), 640),
    "pad_640_to_1024": ("tp1", TP1_DIST + _div(512), TP2 + _div(256), 1024),
}


@pytest.mark.parametrize("case", list(CASES))
def test_reshard_continues_within_1e6_of_the_original_layout(saved, case):
    ckpt, original, other, rows = CASES[case]
    ref, ref_rows = _resume(saved[ckpt], original)
    got, got_rows = _resume(saved[ckpt], other)
    assert ref_rows == got_rows == rows
    assert len(got) == len(ref) == 2
    diff = max(abs(a - b) for a, b in zip(got, ref))
    print(f"{case}: losses {got} vs {ref}, max diff {diff:.2e}")
    assert diff <= 1e-6, (case, got, ref)


def test_a_model_shape_change_names_the_tensor_both_shapes_and_the_directory(saved):
    with pytest.raises(DistributedTestError) as info:
        _run(["--ffn-hidden-size", "128", "--train-iters", "4", "--load", saved["tp1"]], world=1)
    msg = str(info.value)
    assert "decoder.layers.mlp.linear_fc1.weight" in msg, msg
    assert "(2, 256, 64) != requested (2, 128, 64)" in msg, msg
    assert f"{saved['tp1']}/iter_0000002" in msg and "allow_shape_mismatch" not in msg, msg


# --- the state itself: every vocabulary row of the weights and the optimizer state -------------

V_TRUE = 50  # labels and inputs stay below this; rows past it are padding


def _build(tp, vocab, bf16, dist_opt):
    from gigatron.core import parallel_state as ps
    from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from gigatron.core.models.gpt.gpt_model import GPTModel
    from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from gigatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if bf16 else torch.float32
    cfg = TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=4, tensor_model_parallel_size=tp,
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True, bf16=bf16,
        params_dtype=dtype,
    )  # fmt: skip
    model = GPTModel(cfg, get_gpt_layer_local_spec(), vocab, 8).to(dtype)
    ddp_cfg = DistributedDataParallelConfig(
        use_distributed_optimizer=dist_opt, grad_reduce_in_fp32=bf16
    )
    ddp = DistributedDataParallel(cfg, ddp_cfg, model)
    opt = get_megatron_optimizer(
        OptimizerConfig(lr=1e-2, bf16=bf16, params_dtype=dtype, use_distributed_optimizer=dist_opt),
        [ddp],
    )
    return ddp, opt


def _step(ddp, opt, step):
    from gigatron.core import parallel_state as ps

    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, V_TRUE, (4, 8), generator=g)
    labels = torch.randint(0, V_TRUE, (4, 8), generator=g)
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    mine = slice(dp_rank * 4 // dp, (dp_rank + 1) * 4 // dp)
    ddp.zero_grad_buffer()
    opt.zero_grad()
    loss = ddp(ids[mine], None, None, labels=labels[mine]).float().mean()
    loss.backward()
    ddp.finish_grad_sync()
    assert opt.step()[0]
    return loss.item()


def _args(save, load):
    return argparse.Namespace(save=save, load=load, consumed_train_samples=0)


def _train_save(path, layout):
    from gigatron.training import checkpointing as ckpt

    ddp, opt = _build(*layout)
    for step in range(2):
        _step(ddp, opt, step)
    ckpt.save_checkpoint(2, [ddp], opt, None, args=_args(path, path))


def _load_resave_step(src, dst, layout):
    from gigatron.training import checkpointing as ckpt

    ddp, opt = _build(*layout)
    assert ckpt.load_checkpoint([ddp], opt, None, args=_args(dst, src))[0] == 2
    ckpt.save_checkpoint(2, [ddp], opt, None, args=_args(dst, src))
    return [_step(ddp, opt, step) for step in (2, 3)]  # Adam steps on the padded state


STATE_CASES = {
    # name: (saved (tp, vocab, bf16, dist_opt), loaded (tp, vocab, bf16, dist_opt)); 2 ranks
    "bf16_trim_tp2_plain_to_tp1_dist": ((2, 96, True, False), (1, 64, True, True)),
    "bf16_pad_tp1_dist_to_tp2_plain": ((1, 64, True, True), (2, 96, True, False)),
    "fp32_pad_tp2_dist_to_tp1_dist": ((2, 64, False, True), (1, 128, False, True)),
}
VOCAB_KEYS = ("embedding.word_embeddings.weight", "output_layer.weight")


@pytest.mark.parametrize("case", list(STATE_CASES))
def test_vocab_rows_of_weights_and_optimizer_state_pad_and_trim_alike(tmp_path, case):
    (save_layout, load_layout) = STATE_CASES[case]
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    run_distributed(_train_save, 2, args=(src, save_layout))
    losses = run_distributed(_load_resave_step, 2, args=(src, dst, load_layout))[0]
    assert all(torch.isfinite(torch.tensor(losses))), losses
    source = dc.load_plain_tensors(f"{src}/iter_0000002")
    again = dc.load_plain_tensors(f"{dst}/iter_0000002")
    assert sorted(again) == sorted(source)
    rows = load_layout[1]
    vocab_keys = [k for k in source if k.endswith(VOCAB_KEYS)]
    # per vocabulary weight: itself, exp_avg, exp_avg_sq (and fp32_param for bf16)
    assert len(vocab_keys) == 2 * (4 if save_layout[2] else 3), vocab_keys
    for key, want in source.items():
        if key in vocab_keys:  # trimmed rows dropped, new rows zero
            want = torch.cat([want, want.new_zeros(max(0, rows - len(want)), *want.shape[1:])])
            want = want[:rows]
        assert torch.equal(again[key], want), (case, key)
    if save_layout[2]:  # the fp32 main copy is the weight, row for row
        main = again["optimizer.state.fp32_param.embedding.word_embeddings.weight"]
        assert torch.equal(main.bfloat16(), again["embedding.word_embeddings.weight"])
