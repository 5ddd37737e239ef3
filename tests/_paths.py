"""Repository paths for tests, whatever folder a test file sits in."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
# megatron-core, the parity oracle: a folder outside the venv (`make oracle`), put on sys.path by
# tests/conftest.py for the test session only
MEGATRON_ORACLE = Path(os.environ.get("MEGATRON_ORACLE") or REPO / ".venv-oracle").resolve()


def with_oracle(env: dict[str, str]) -> dict[str, str]:
    """`env` for a fresh interpreter that needs megatron-core: the oracle folder on PYTHONPATH
    (after what is there), when it exists."""
    if not MEGATRON_ORACLE.is_dir():
        return env
    paths = [p for p in (env.get("PYTHONPATH", ""), str(MEGATRON_ORACLE)) if p]
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}
