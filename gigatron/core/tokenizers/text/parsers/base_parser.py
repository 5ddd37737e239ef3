"""`BaseParser`: a text parser's interface, `parse(text, **kwargs) -> (content, info)`."""

from __future__ import annotations

from typing import Any


class BaseParser:
    """Parses generated text into (content left for the caller, extracted information)."""

    @staticmethod
    def parse(text: str, **kwargs) -> tuple[str, dict[str, Any]]:
        """The base parser extracts nothing: `(text, {})`."""
        return text, {}
