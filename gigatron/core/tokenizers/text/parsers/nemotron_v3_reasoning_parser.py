"""`NemotronV3ReasoningParser`: DeepSeek R1's `<think>` split, with the reasoning given back as
the content when there would be no content and the request turned thinking off
(`chat_template_kwargs={"enable_thinking": False}`) or asked for non-empty content
(`{"force_nonempty_content": True}`)."""

from __future__ import annotations

from gigatron.core.tokenizers.text.parsers.deepseek_r1_reasoning_parser import (
    DeepSeekR1ReasoningParser,
)


class NemotronV3ReasoningParser(DeepSeekR1ReasoningParser):
    """Nemotron 3 (Super, Ultra) reasoning output; see the module docstring."""

    @staticmethod
    def _should_force_content(chat_template_kwargs: dict | None) -> bool:
        kw = chat_template_kwargs or {}
        return kw.get("enable_thinking") is False or kw.get("force_nonempty_content") is True

    @staticmethod
    def parse(text: str, **kwargs) -> tuple[str, dict[str, str]]:
        content, info = DeepSeekR1ReasoningParser.parse(text, **kwargs)
        forced = NemotronV3ReasoningParser._should_force_content(kwargs.get("chat_template_kwargs"))
        if content == "" and info.get("reasoning") and forced:
            return info["reasoning"], {}
        return content, info
