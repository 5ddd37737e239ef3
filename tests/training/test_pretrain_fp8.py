"""FP8 through the training entry (issue 33): a tiny GPT trains under `--fp8-format hybrid
--fp8-recipe tensorwise` on 2 gloo ranks (TP 2 with sequence parallelism), its losses within FP8
noise of the same run without FP8, and checkpoints carry nothing FP8: a run resumes with FP8
switched off, and a run saved without FP8 resumes with it on. FP8 composes with the other
layouts of the same 2 ranks: PP 2 with full recompute, and DP 2 with the distributed optimizer
and gradient accumulation fusion cast the same tensors with the same scales as TP 2 and give its
losses; CP 2 (each rank scales its half of the sequence) within FP8's noise of them."""

import math

import pytest

pytest.importorskip("torchao.float8")

from gigatron.testing import run_distributed  # noqa: E402

pytestmark = pytest.mark.multirank

ARGS = [
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
    "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
    "--lr", "1e-2", "--mock-data", "--vocab-size", "128", "--make-vocab-size-divisible-by", "128",
    "--log-interval", "100", "--eval-iters", "0", "--no-progress-bar", "--num-workers", "0",
    "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "5",
    "--use-cpu-initialization",  # every layout starts from the same full model (padded vocab 256)
]  # fmt: skip
TP2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]
LAYOUTS = {
    "pp2_recompute": ["--pipeline-model-parallel-size", "2", "--recompute-granularity", "full",
                      "--recompute-method", "uniform", "--recompute-num-layers", "1"],
    "dp2_distopt": ["--use-distributed-optimizer"],  # main_grad fusion is on by default
    "cp2": ["--context-parallel-size", "2"],
}  # fmt: skip
FP8 = ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"]


def _runs(ckpt_dir):
    """(losses, last iteration) of: FP8 3 steps saved, bf16 3 steps saved, then each checkpoint
    resumed for a 4th step with FP8 toggled."""
    from tests.training._gpt_runs import run_pretrain_gpt

    def run(extra, layout=TP2):
        result = run_pretrain_gpt(ARGS + layout + extra)
        # the last pipeline stage reports the loss (rank 1 under PP 2)
        losses = [h["losses"].get("lm loss") for h in result["history"]]
        return losses, result["iteration"]

    fp8_ckpt, ref_ckpt = f"{ckpt_dir}/fp8", f"{ckpt_dir}/ref"
    three = ["--train-iters", "3"]
    four = ["--train-iters", "4", "--override-opt-param-scheduler"]
    out = {
        "fp8": run(FP8 + three + ["--save", fp8_ckpt]),
        "ref": run(three + ["--save", ref_ckpt]),
        "fp8_then_off": run(four + ["--load", fp8_ckpt]),
        "off_then_fp8": run(FP8 + four + ["--load", ref_ckpt]),
    }
    for name, layout in LAYOUTS.items():
        out[name] = run(FP8 + three, layout)
    return out


@pytest.fixture(scope="module")
def fp8_runs(tmp_path_factory):
    """Every run, in one spawned pair of ranks (each run's losses from a rank that has them)."""
    ranks = run_distributed(_runs, 2, args=(str(tmp_path_factory.mktemp("fp8")),), timeout=180)
    return {k: v if None not in v[0] else ranks[1][k] for k, v in ranks[0].items()}


def test_gpt_trains_in_fp8_and_resumes_with_fp8_toggled(fp8_runs):
    out = fp8_runs
    fp8, ref = out["fp8"][0], out["ref"][0]
    assert out["fp8"][1] == 3 and len(fp8) == 3
    assert all(math.isfinite(x) for x in fp8)
    for step, (a, b) in enumerate(zip(fp8, ref, strict=True)):
        assert a != b and abs(a - b) <= 0.02 * b, (step, a, b)  # FP8 ran, within its noise
    assert fp8[-1] < fp8[0]
    for key in ("fp8_then_off", "off_then_fp8"):
        losses, iteration = out[key]
        assert iteration == 4 and len(losses) == 1, (key, out[key])
        assert math.isfinite(losses[0]) and abs(losses[0] - ref[-1]) <= 0.1 * ref[-1], key


def test_fp8_layouts_give_the_tp2_losses(fp8_runs):
    fp8 = fp8_runs["fp8"][0]
    for name, tol in (("pp2_recompute", 1e-5), ("dp2_distopt", 1e-5), ("cp2", 1e-2)):
        losses, iteration = fp8_runs[name]
        assert iteration == 3 and len(losses) == 3, name
        for step, (a, b) in enumerate(zip(losses, fp8, strict=True)):
            assert abs(a - b) <= tol * b, (name, step, a, b)
