"""Megatron Core's experimental-features switch (mirrors `megatron.core.config`).

Megatron gates APIs marked experimental behind `ENABLE_EXPERIMENTAL` (set by
`--enable-experimental`). gigatron has no API gated by it; the flag is kept so code and tests
that set or read it run unchanged.
"""

from __future__ import annotations

ENABLE_EXPERIMENTAL = False


def set_experimental_flag(flag: bool) -> None:
    """Set the experimental flag."""
    global ENABLE_EXPERIMENTAL
    ENABLE_EXPERIMENTAL = flag


def is_experimental_enabled() -> bool:
    return ENABLE_EXPERIMENTAL
