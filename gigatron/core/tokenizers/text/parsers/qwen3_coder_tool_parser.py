"""`Qwen3CoderToolParser`: tool calls written in Qwen3-Coder's XML-like form,

    <tool_call><function=NAME><parameter=ARG>VALUE</parameter>...</function></tool_call>

turned into OpenAI-style calls `{"type": "function", "id": "call_...", "function": {"name",
"arguments": JSON}}`. Closing tags may be missing (a cut-off answer): a block then runs to the
end, a parameter to the next `<parameter=` / `</function>`. Without any `<tool_call>`, the whole
text is searched for `<function=` blocks. Each value is converted by the parameter's JSON-schema
type in `tools` (integers, numbers, booleans, objects / arrays; "null" is None); a value that
does not convert stays a string (booleans: anything but "true" is False).
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from typing import Any

from gigatron.core.tokenizers.text.parsers.base_parser import BaseParser

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_FUNCTION = re.compile(r"<function=(.*?)(?:</function>|$)", re.DOTALL)
_PARAMETER = re.compile(
    r"<parameter=(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|$)", re.DOTALL
)
_STRING = ("string", "str", "text", "varchar", "char", "enum")
_INTEGER = ("int", "uint", "long", "short", "unsigned")


def _schema(name: str, tools: list | None) -> dict:
    """The `properties` of tool `name`'s parameters (or the parameters dict itself)."""
    for tool in tools or []:
        fn = tool.get("function", {}) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or tool.get("type") != "function" or fn.get("name") != name:
            continue
        params = fn.get("parameters", {})
        if not isinstance(params, dict):
            return {}
        return params.get("properties", params)
    return {}


def _json_type(spec: Any) -> str:
    if isinstance(spec, dict) and "type" in spec:
        return str(spec["type"]).strip().lower()
    if isinstance(spec, dict) and "anyOf" in spec:
        return "object"
    return "string"


def _convert(value: str, name: str, schema: dict) -> Any:
    if value.lower() == "null":
        return None
    if name not in schema:
        return value
    kind = _json_type(schema[name])
    if kind in _STRING:
        return value
    if kind.startswith(_INTEGER):
        try:
            return int(value)
        except ValueError:
            return value
    if kind.startswith(("num", "float")):
        try:
            x = float(value)
        except ValueError:
            return value
        return int(x) if x.is_integer() else x
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    if kind in ("object", "array", "arr") or kind.startswith(("dict", "list")):
        try:
            return json.loads(value)
        except ValueError:
            pass
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


def _call(block: str, tools: list | None) -> dict | None:
    """One `NAME>...parameters...` function block as a tool call, None when it has no name."""
    name, sep, body = block.partition(">")
    if not sep:
        return None
    schema, args = _schema(name, tools), {}
    for param in _PARAMETER.findall(body):
        key, sep, value = param.partition(">")
        if not sep:  # a parameter cut off before its value
            continue
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        args[key] = _convert(value, key, schema)
    arguments = json.dumps(args, ensure_ascii=False)
    call_id = f"call_{uuid.uuid4().hex[:24]}"
    return {"type": "function", "id": call_id, "function": {"name": name, "arguments": arguments}}


class Qwen3CoderToolParser(BaseParser):
    """`parse(text, tools=[...])` -> (content before the first call or None,
    {"tool_calls": [...]}), or `(text, {})` when the text calls no tool."""

    implicit_reasoning_end_markers = ("<tool_call>",)
    streaming_markers = ("<tool_call>", "<function=")

    @staticmethod
    def parse(text: str, **kwargs) -> tuple[str | None, dict[str, list[dict]]]:
        if "<function=" not in text:
            return text, {}
        blocks = _BLOCK.findall(text) or [text]
        functions = [f for b in blocks for f in _FUNCTION.findall(b)]
        calls = [c for f in functions if (c := _call(f, kwargs.get("tools", []))) is not None]
        if not calls:
            return text, {}
        start = text.find("<tool_call>")
        content = text[: start if start >= 0 else text.find("<function=")]
        return (content or None), {"tool_calls": calls}
