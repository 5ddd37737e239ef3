"""megatron.core.tokenizers.text.parsers: the <think> reasoning split, Nemotron 3's fallback to
content, and Qwen3-Coder tool calls."""

import json

import pytest

from gigatron.core.tokenizers.text.parsers import PARSER_MAPPING
from gigatron.core.tokenizers.text.parsers.base_parser import BaseParser
from gigatron.core.tokenizers.text.parsers.deepseek_r1_reasoning_parser import (
    DeepSeekR1ReasoningParser as R1,
)
from gigatron.core.tokenizers.text.parsers.nemotron_v3_reasoning_parser import (
    NemotronV3ReasoningParser as V3,
)
from gigatron.core.tokenizers.text.parsers.qwen3_coder_tool_parser import Qwen3CoderToolParser

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {
    "n": {"type": "integer"}, "x": {"type": "number"}, "ok": {"type": "boolean"},
    "items": {"type": "array"}, "s": {"type": "string"},
}}}}]  # fmt: skip


@pytest.mark.parametrize(
    "text,content,info",
    [
        ("pre<think>r</think>answer", "answer", {"reasoning": "r"}),
        ("<think>still thinking", "", {"reasoning": "still thinking"}),
        ("no tags at all", "", {"reasoning": "no tags at all"}),
        ("<think></think>answer", "answer", {}),
    ],
)
def test_r1_splits_reasoning_from_content(text, content, info):
    assert R1.parse(text) == (content, info)


def test_r1_implicit_end_marker_stays_with_the_content():
    text = "plan<tool_call>call</tool_call></think>after"
    assert R1.parse(text, implicit_reasoning_end_markers=("<tool_call>",)) == (
        "<tool_call>call</tool_call></think>after", {"reasoning": "plan"},
    )  # fmt: skip
    assert R1.parse("plan<tool_call>x") == ("", {"reasoning": "plan<tool_call>x"})


@pytest.mark.parametrize("kw", [{"enable_thinking": False}, {"force_nonempty_content": True}])
def test_nemotron_v3_gives_reasoning_as_content_when_asked(kw):
    assert V3.parse("<think>hello</think>", chat_template_kwargs=kw) == ("hello", {})
    assert V3.parse("<think>a</think>b", chat_template_kwargs=kw) == ("b", {"reasoning": "a"})
    assert V3.parse("<think>hello", chat_template_kwargs={"enable_thinking": True}) == (
        "", {"reasoning": "hello"},
    )  # fmt: skip


def test_qwen3_tool_call_converts_values_by_schema():
    text = (
        "Sure.<tool_call><function=f><parameter=n>\n7\n</parameter><parameter=x>2.0"
        "</parameter><parameter=ok>True</parameter><parameter=items>[1, 2]</parameter>"
        "<parameter=s>null</parameter><parameter=extra>v</parameter></function></tool_call>"
    )
    content, info = Qwen3CoderToolParser.parse(text, tools=TOOLS)
    (call,) = info["tool_calls"]
    assert content == "Sure." and call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "f"
    args = json.loads(call["function"]["arguments"])
    assert args == {"n": 7, "x": 2, "ok": True, "items": [1, 2], "s": None, "extra": "v"}


def test_qwen3_unterminated_and_untagged_calls():
    content, info = Qwen3CoderToolParser.parse("<function=f><parameter=n>x1<parameter=x>1.5",
                                               tools=TOOLS)  # fmt: skip
    assert content is None
    assert json.loads(info["tool_calls"][0]["function"]["arguments"]) == {"n": "x1", "x": 1.5}
    assert Qwen3CoderToolParser.parse("plain answer") == ("plain answer", {})
    assert Qwen3CoderToolParser.parse("<function=nameless") == ("<function=nameless", {})


def test_mapping_and_base():
    assert PARSER_MAPPING == {"deepseek-r1-reasoning": R1, "qwen3-coder-tool": Qwen3CoderToolParser,
                              "nemotron-v3-reasoning": V3}  # fmt: skip
    assert BaseParser.parse("t") == ("t", {})
    assert Qwen3CoderToolParser.implicit_reasoning_end_markers == ("<tool_call>",)
