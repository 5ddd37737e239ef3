"""gigatron.training.datasets.varlen_dataset: schema detection and message normalization."""

import pytest

from gigatron.training.datasets import varlen_dataset as v


def test_hf_id_heuristic(tmp_path):
    assert v._looks_like_hf_id("owner/repo")
    local = tmp_path / "a"
    local.mkdir()
    for path in (str(local), "./x/y", "../x/y", "single", "", None):
        assert not v._looks_like_hf_id(path)


def test_alpaca_with_context_synonym():
    out = v._alpaca_to_messages({"question": "Q", "context": "C", "answer": "A"})
    assert out == [
        {"role": "system", "content": ""},
        {"role": "user", "content": "Q\n\nC"},
        {"role": "assistant", "content": "A"},
    ]


def test_sharegpt_roles_and_system_turn():
    conv = [{"from": "system", "value": "s"}, {"from": "bard", "value": "b"}, {"from": "x"}]
    out = v._sharegpt_to_messages({"conversations": conv})
    assert [(m["role"], m["content"]) for m in out] == [
        ("system", "s"),
        ("assistant", "b"),
        ("user", ""),
    ]
    assert v._sharegpt_to_messages({"conversations": []}) == [{"role": "system", "content": ""}]


def test_messages_keep_role_and_content_only():
    out = v._messages_passthrough({"messages": [{"role": "user", "content": "hi", "name": "a"}]})
    assert out == [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "call",
    [
        lambda: v._messages_passthrough({"messages": [{"role": "user", "content": ["img"]}]}),
        lambda: v._alpaca_to_messages({"prompt": 3, "output": "x"}),
        lambda: v._raw_text_loader({"text": ["t"]}),
    ],
)
def test_non_string_content_is_rejected(call):
    with pytest.raises(ValueError, match="must be a string"):
        call()


@pytest.mark.parametrize(
    ("cols", "schema"),
    [
        (["text", "messages", "conversations"], "openai-messages"),
        (["conversations", "instruction", "output"], "sharegpt"),
        (["text", "prompt", "completion"], "alpaca"),
        (["text", "url"], "pretrain-text"),
    ],
)
def test_schema_priority(cols, schema):
    assert v._select_converter(cols)[1] == schema


def test_unknown_columns_name_the_columns():
    with pytest.raises(ValueError, match=r"cannot infer schema from columns \['instruction'\]"):
        v._select_converter(["instruction"])
