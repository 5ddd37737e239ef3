"""Repository paths for tests, whatever folder a test file sits in."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
# megatron-core, the parity oracle: a folder outside the venv (`make oracle`), put on sys.path by
# tests/conftest.py for the test session only
MEGATRON_ORACLE = Path(os.environ.get("MEGATRON_ORACLE") or REPO / ".venv-oracle").resolve()


def put_oracle_first(paths: list[str], oracle: Path = MEGATRON_ORACLE) -> None:
    """Put the oracle folder at the front of `paths` (sys.path): a megatron-core that an older
    setup left in .venv's site-packages must not shadow it. The folder holds only `megatron`, so
    nothing of gigatron's is shadowed."""
    if str(oracle) in paths:
        paths.remove(str(oracle))
    paths.insert(0, str(oracle))


def with_oracle(env: dict[str, str]) -> dict[str, str]:
    """`env` for a fresh interpreter that needs megatron-core: the oracle folder first on
    PYTHONPATH (ahead of site-packages, as in the test session), when it exists."""
    if not MEGATRON_ORACLE.is_dir():
        return env
    paths = [p for p in (str(MEGATRON_ORACLE), env.get("PYTHONPATH", "")) if p]
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}
