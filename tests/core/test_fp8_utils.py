"""Which linears run in FP8 (gigatron.core.fp8_utils): the transformer layers' Column/Row
parallel linears, minus the first / last layers under first_last_layers_bf16; never the output
layer. A config with fp8 off imports no torchao."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torchao.float8")

from gigatron.core.models.gpt import GPTModel  # noqa: E402
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: E402
from gigatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from gigatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402
from tests._one_rank import one_rank_fixtures  # noqa: E402
from tests._paths import REPO  # noqa: E402

gloo_world, single_rank = one_rank_fixtures()


def _fp8_layers(**kw):
    config = TransformerConfig(
        num_layers=4, hidden_size=32, num_attention_heads=4, use_cpu_initialization=True,
        fp8="hybrid", fp8_recipe="tensorwise", **kw,
    )  # fmt: skip
    model = GPTModel(config, get_gpt_layer_local_spec(), 64, 16)
    on = set()
    for name, m in model.named_modules():
        if isinstance(m, (ColumnParallelLinear, RowParallelLinear)) and m.fp8_recipe is not None:
            on.add(name.split(".")[2] if name.startswith("decoder.layers.") else name)
    assert model.output_layer.fp8_recipe is None
    return on


def test_transformer_layers_run_in_fp8_except_the_first_and_last_when_asked():
    assert _fp8_layers() == {"0", "1", "2", "3"}
    assert _fp8_layers(first_last_layers_bf16=True) == {"1", "2"}
    both = dict(num_layers_at_start_in_bf16=2, num_layers_at_end_in_bf16=0)
    assert _fp8_layers(first_last_layers_bf16=True, **both) == {"2", "3"}


def test_fp8_off_imports_no_torchao():
    code = (
        "import sys\n"
        "from gigatron.core.transformer.transformer_config import TransformerConfig\n"
        "from gigatron.core.tensor_parallel import ColumnParallelLinear\n"
        "TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2)\n"
        "assert not any(m.startswith('torchao') for m in sys.modules), 'torchao imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_rowwise_recipe_on_a_torch_without_cpu_row_scales_is_refused_by_name(monkeypatch):
    """torch 2.11's CPU _scaled_mm takes per-tensor scales only: a row-wise recipe on a machine
    without CUDA stops at once, naming the recipe and what works there."""
    from types import SimpleNamespace

    from gigatron.core import fp8_utils

    monkeypatch.setattr(fp8_utils, "cpu_takes_rowwise_scales", lambda: False)
    monkeypatch.setattr(fp8_utils.torch.cuda, "is_available", lambda: False)
    cfg = SimpleNamespace(fp8="e4m3", fp8_recipe="rowwise", fp8_margin=0, fp8_wgrad=True)
    with pytest.raises(
        ValueError, match="--fp8-recipe rowwise on CPU .* use --fp8-recipe tensorwise"
    ):
        fp8_utils.get_fp8_recipe(cfg)
    cfg.fp8_recipe = "tensorwise"
    assert fp8_utils.get_fp8_recipe(cfg).name == "tensorwise"


def test_torchao_import_prints_no_failed_kernel_library_lines():
    """torchao logs one "Failed to load .../_C_mxfp8...so" line per GPU-only kernel library at
    import; FP8 runs import it through fp8_utils, which drops exactly those lines."""
    pytest.importorskip("torchao")
    code = "from gigatron.core.fp8_utils import _torchao; _torchao(); print('imported')"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "imported" in proc.stdout, proc.stderr
    assert "Failed to load" not in proc.stderr, proc.stderr
    assert "is an Enum subclass" not in proc.stderr, proc.stderr


def test_the_torchao_import_filter_drops_only_its_import_noise():
    import logging

    from gigatron.core.fp8_utils import _TorchaoImportNoise

    def record(name, message):
        return logging.LogRecord(name, logging.WARNING, __file__, 1, message, None, None)

    noise = _TorchaoImportNoise()
    assert not noise.filter(record("torchao", "Failed to load /x/torchao/_C_mxfp8.so: no GPU"))
    assert noise.filter(record("torchao", "Skipping import of cpp extensions due to ..."))
    assert noise.filter(record("torchao", "Failed to load config.json"))


def test_fp8_false_means_off_as_megatron_reads_it():
    config = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4, fp8=False)
    assert config.fp8 is None
    with pytest.raises(ValueError, match="must be one of"):
        TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4, fp8="e5m2")
