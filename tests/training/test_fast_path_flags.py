"""The training entry's fast-path flags keep the numbers: `--cross-entropy-loss-fusion`
(chunked output layer + cross entropy; also `--cross-entropy-fusion-impl native_grad_in_forward`
with `--eod-mask-loss`), `--tp-comm-overlap` (SP all-gather overlapped with
GEMMs) and gigatron's `--torch-compile layers`, each against the same run without it."""

import shutil

import pytest

from gigatron.testing import run_distributed
from tests.training._gpt_runs import ARGS, run_pretrain_gpt

pytestmark = pytest.mark.multirank


def _losses(extra):
    from gigatron.core.transformer.transformer_layer import TransformerLayer

    result = run_pretrain_gpt(ARGS + ["--train-iters", "4", "--seed", "5"] + extra)
    model = result["model"][0].module
    layers = [m for m in model.modules() if isinstance(m, TransformerLayer)]
    # (every layer compiled, the whole model compiled, layer groups of the decoder)
    compiled = (
        all(layer._compiled_call_impl is not None for layer in layers),
        model._compiled_call_impl is not None,  # --torch-compile model
        len(getattr(model.decoder, "_compiled_layer_groups", None) or []),
    )
    cfg = model.config
    losses = [h["losses"]["lm loss"] for h in result["history"]]
    return (
        losses,
        compiled,
        (
            cfg.cross_entropy_loss_fusion,
            cfg.tp_comm_overlap,
            cfg.cross_entropy_fusion_impl,
        ),
    )


def _close(a, b, tol):
    return all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b, strict=True))


def test_ce_fusion_and_tp_comm_overlap_match_the_plain_run_at_tp2_sp():
    tp = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]
    fast = ["--cross-entropy-loss-fusion", "--tp-comm-overlap"]
    # gigatron's 'native_grad_in_forward': gradients computed in forward, scaled in backward by
    # the loss mask's factor (EOD tokens masked, 4 microbatches a step): same losses.
    eod = ["--eod-mask-loss"]
    impl = ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "native_grad_in_forward"]
    extras = [tp, tp + fast, tp + eod, tp + eod + impl]
    for plain, fused, plain_eod, in_fwd in run_distributed(
        _losses_each, 2, args=(extras,), timeout=600
    ):  # one rank group runs the four in turn
        (a, _, flags), (b, _, plain_flags) = fused, plain
        assert flags == (True, True, "native") and plain_flags == (False, False, "native")
        assert len(a) == 4 and _close(a, b, 1e-6), (a, b)
        (a, _, flags), (b, _, _) = in_fwd, plain_eod
        assert flags[0] and flags[2] == "native_grad_in_forward", flags
        assert len(a) == 4 and _close(a, b, 1e-6), (a, b)


def _losses_each(extras):
    """`_losses` of each flag list in turn, in one process (one spawn instead of one each)."""
    return [_losses(extra) for extra in extras]


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile on CPU needs a C++ compiler")  # fmt: skip
def test_torch_compile_layers_and_model_match_eager():
    # the whole model compiled around layer groups (its graphs stop before and after them) last
    grouped = ["--torch-compile", "model", "--torch-compile-layers-per-graph", "1,1"]
    extras = [[], ["--torch-compile", "layers"], ["--torch-compile", "model"], grouped]
    ((runs,),) = [run_distributed(_losses_each, 1, args=(extras,), timeout=900)]
    (eager, was_compiled, _), (compiled, is_compiled, _), (whole, whole_compiled, _) = runs[:3]
    grouped, grouped_compiled, _ = runs[3]
    assert was_compiled == (False, False, 0), was_compiled
    assert is_compiled == (True, False, 0), is_compiled
    assert whole_compiled == (False, True, 0), whole_compiled
    assert grouped_compiled == (False, True, 2), grouped_compiled  # groups set, not just model
    assert _close(compiled, eager, 1e-5), (compiled, eager)
    assert _close(whole, eager, 1e-5), (whole, eager)
    assert _close(grouped, eager, 1e-5), (grouped, eager)


def test_layers_per_graph_needs_torch_compile():
    from gigatron.testing import DistributedTestError

    with pytest.raises(DistributedTestError, match="--torch-compile-layers-per-graph 2 needs"):
        run_distributed(_losses, 1, args=(["--torch-compile-layers-per-graph", "2"],))


def test_torch_compile_mode_needs_torch_compile():
    from gigatron.testing import DistributedTestError

    with pytest.raises(DistributedTestError, match="--torch-compile-mode reduce-overhead needs"):
        run_distributed(_losses, 1, args=(["--torch-compile-mode", "reduce-overhead"],))
