"""bench_gpt.py --optimizer flat (gigatron's FlatAdamW over DDP's grad buffers) and
--optimizer multi-tensor (MultiTensorAdamW) train like the torch AdamW step on CPU: same losses
after four steps; flat refuses to run without DDP.
bench_adamw.py / bench_gemm_shapes.py: their GPT shapes are the bench model's; other configs
are refused."""

import json
import os
import subprocess
import sys

import pytest

from bench._lib import args as _bench_args
from bench.gpt import bench_gemm_shapes, bench_gpt
from bench.optimizer import bench_adamw
from tests._one_rank import one_rank_fixtures
from tests._paths import REPO
from tests._ports import free_port

gloo_world, single_rank = one_rank_fixtures()

ROOT = str(REPO)


def _bench(*flags):
    cmd = [sys.executable, os.path.join(ROOT, "bench", "gpt", "bench_gpt.py"), "--config", "tiny"]
    cmd += ["--device", "cpu", "--steps", "3", "--warmup", "1", *flags]
    env = dict(os.environ, MASTER_PORT=str(free_port()))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    return out, (json.loads(lines[-1][7:]) if lines else None)


@pytest.mark.parametrize("optimizer", ["flat", "flat-overlap", "multi-tensor"])
def test_gigatron_optimizers_match_torch_adamw_in_the_bench(optimizer):
    _, got = _bench("--ddp", "on", "--optimizer", optimizer)
    _, ref = _bench("--ddp", "on", "--optimizer", "torch-foreach")
    assert got["switches"]["optimizer"] == optimizer
    assert got["loss"] == ref["loss"] and got["first_loss"] == ref["first_loss"]
    assert got["loss"] < got["first_loss"] - 0.05  # the optimizer really stepped


def test_flat_optimizer_needs_ddp():
    out, result = _bench("--ddp", "off", "--optimizer", "flat")
    assert result is None and out.returncode != 0
    assert "--optimizer flat needs DDP" in out.stderr


def test_adamw_bench_shapes_are_the_bench_models_and_other_configs_are_refused():
    a = _bench_args.parse_args(["--config", "tiny", "--device", "cpu"])
    shape = dict(_bench_args.CONFIGS["tiny"])
    model, _ = bench_gpt.build_model(shape, a)
    got = sorted(tuple(p.shape) for p in model.parameters() if p.requires_grad)
    assert got == sorted(bench_adamw.param_shapes(shape))
    for bench in (bench_adamw, bench_gemm_shapes):
        assert {"gpt-125m", "gpt-1.3b"} <= set(bench.GPT_CONFIGS)
        with pytest.raises(SystemExit):  # GQA / SwiGLU / RMSNorm shapes: not these benches'
            bench.main(["--config", "llama-1b"])
