"""`python -m gigatron.tools.<tool>` runs the tool, as Megatron's `python tools/<tool>.py` does
(preprocess_data, merge_datasets and train_tokenizer had no `__main__` guard: `-m` imported the
module, did nothing and exited 0, so a preprocessing script silently wrote no data)."""

import subprocess
import sys

import pytest

TOOLS = ["preprocess_data", "merge_datasets", "train_tokenizer", "convert", "generate"]


@pytest.mark.parametrize("tool", TOOLS)
def test_module_entry_parses_its_flags(tool):
    out = subprocess.run(
        [sys.executable, "-m", f"gigatron.tools.{tool}", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout, (tool, out.stdout, out.stderr)


def test_preprocess_module_entry_writes_the_dataset(tmp_path):
    """A real run through `-m`: the .bin / .idx exist and hold the document's tokens."""
    from tests.fixtures.bert_t5.corpus import write_hf_tokenizer

    write_hf_tokenizer(str(tmp_path / "tok"))
    (tmp_path / "in.jsonl").write_text('{"text": "a b c"}\n{"text": "b c"}\n')
    prefix = str(tmp_path / "out")
    out = subprocess.run(
        [sys.executable, "-m", "gigatron.tools.preprocess_data", "--input",
         str(tmp_path / "in.jsonl"), "--output-prefix", prefix, "--tokenizer-type",
         "HuggingFaceTokenizer", "--tokenizer-model", str(tmp_path / "tok"), "--workers", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    from gigatron.core.datasets.indexed_dataset import IndexedDataset

    assert len(IndexedDataset(prefix + "_text_document")) == 2
