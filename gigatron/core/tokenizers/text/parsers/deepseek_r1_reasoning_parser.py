"""`DeepSeekR1ReasoningParser`: the reasoning of a `<think>...</think>` answer split from its
content."""

from __future__ import annotations

from gigatron.core.tokenizers.text.parsers.base_parser import BaseParser

OPEN, CLOSE = "<think>", "</think>"


class DeepSeekR1ReasoningParser(BaseParser):
    """`parse(text, implicit_reasoning_end_markers=())` -> (content, {"reasoning": r} or {}).

    Text before the first `<think>` is dropped. Reasoning runs up to the first `</think>` (which
    is removed) or, earlier, the first of `implicit_reasoning_end_markers` (which stays, at the
    start of the content, for a downstream tool parser). Without either, all of it is reasoning
    and the content is "". An empty reasoning gives an empty info dict.
    """

    @staticmethod
    def parse(text: str, **kwargs) -> tuple[str, dict[str, str]]:
        head, opened, tail = text.partition(OPEN)
        body = tail if opened else head
        end = body.find(CLOSE)
        start = end + len(CLOSE) if end >= 0 else -1
        for marker in kwargs.get("implicit_reasoning_end_markers", ()):
            at = body.find(marker)
            if at >= 0 and (end < 0 or at < end):
                end, start = at, at  # the marker belongs to the content
        if end < 0:
            reasoning, content = body, ""
        else:
            reasoning, content = body[:end], body[start:]
        return content, ({"reasoning": reasoning} if reasoning else {})
