"""`gigatron train / generate --load` of a Gemma directory or converted checkpoint: one-line
refusal (its features have no train flags, so saved args cannot describe the model)."""

import pytest

from tests.convert.test_hf_fixtures import make_hf_model

pytest.importorskip("transformers")


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_load_of_gemma_names_the_python_api(family, tmp_path):
    from gigatron.training.checkpoint_args import checkpoint_model_args

    make_hf_model(family, str(tmp_path))
    with pytest.raises(ValueError) as info:
        checkpoint_model_args(str(tmp_path))
    message = str(info.value)
    assert f"a {family} model" in message and "build_model" in message and "\n" not in message
