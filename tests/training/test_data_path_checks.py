"""`--data-path` mistakes are one line naming the flag: a prefix given with its `.bin` / `.idx`
extension, a blend weight that is not a finite number >= 0."""

import pytest

from gigatron.cli import main

MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
         "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "2", "--lr", "1e-3",
         "--vocab-size", "100"]  # fmt: skip


def _err(argv, capsys):
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("ext", [".bin", ".idx"])
def test_prefix_with_its_extension_says_which_prefix_to_give(tmp_path, capsys, ext):
    prefix = str(tmp_path / "corpus_text_document")
    for e in (".bin", ".idx"):
        open(prefix + e, "wb").close()
    err = _err(["train", *MODEL, "--data-path", prefix + ext], capsys)
    assert err == (
        f"gigatron train: error: --data-path {prefix}{ext}: --data-path takes the prefix "
        f"without .bin / .idx: did you mean --data-path {prefix}?"
    )


@pytest.mark.parametrize("weight", ["inf", "nan", "-1"])
def test_blend_weight_that_is_not_finite_and_non_negative_names_the_flag(tmp_path, capsys, weight):
    prefixes = [str(tmp_path / "a"), str(tmp_path / "b")]
    for prefix in prefixes:
        for e in (".bin", ".idx"):
            open(prefix + e, "wb").close()
    argv = ["train", *MODEL, "--data-path", weight, prefixes[0], "1", prefixes[1]]
    err = _err(argv, capsys)
    assert err.startswith(f"gigatron train: error: --data-path: weight {weight} of {prefixes[0]}")
    assert "finite number >= 0" in err
