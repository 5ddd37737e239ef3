"""scripts/megatron_test_results.classify: failures that need Megatron's CI container files."""

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "megatron_test_results.py"
_spec = importlib.util.spec_from_file_location("megatron_test_results", _PATH)
results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(results)


def test_ci_container_paths_are_their_own_class():
    tools = "FileNotFoundError: [Errno 2] No such file or directory: '/opt/megatron-lm/tools/x.py'"
    data = "FileNotFoundError: [Errno 2] No such file or directory: '/opt/data/datasets/a.jsonl'"
    assert results.classify(tools) == "needs Megatron's CI data or network"
    assert results.classify(data) == "needs Megatron's CI data or network"
    other = "FileNotFoundError: [Errno 2] No such file or directory: '/tmp/x'"
    assert results.classify(other) == results.UNCLASSIFIED
