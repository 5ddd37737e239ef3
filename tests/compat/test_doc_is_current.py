"""docs/compat.md is generated from gigatron.compat by scripts/gen_compat.py: it must be current."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from gigatron.compat import loss_reports, megatron_only_fields, missing_names
from gigatron.training import compat_flags as training_args
from tests._paths import REPO, with_oracle

ROOT = REPO
SCRIPT = ROOT / "scripts" / "gen_compat.py"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_compat", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_doc_is_what_the_generator_writes():
    # own process: the generator imports megatron-core (when installed) for the API table
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"],
        capture_output=True, text=True, timeout=300, env=with_oracle(dict(os.environ)),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr + "\nrun: python scripts/gen_compat.py"


def test_every_compat_rule_is_on_the_page():
    page = "\n".join(_gen().compat_lines())
    names = [
        *megatron_only_fields.PARALLEL,
        *megatron_only_fields.TRANSFORMER,
        *megatron_only_fields.OPTIMIZER,
        *megatron_only_fields.DECLARED_PARALLEL,
        *megatron_only_fields.DECLARED_TRANSFORMER,
        *megatron_only_fields.RESTRICTED,
        *missing_names.NOT_MEGATRON_FIELDS,
        *missing_names.NOT_IN_MEGATRON,
        *loss_reports.TENSOR_METHODS,
        *training_args.NO_OPS,
        *training_args.REFUSED_CKPT_FORMATS,
        *training_args.TOKENIZER_TYPES,
    ]
    missing = [name for name in names if f"`{name}`" not in page]
    assert not missing, missing


def test_the_api_table_is_kept_without_megatron_core(monkeypatch):
    gen = _gen()
    committed = (ROOT / "docs" / "compat.md").read_text()
    monkeypatch.setattr(gen, "_installed_megatron", lambda: None)
    assert gen.render(committed) == committed
