"""Which `_target_` names a config file may make gigatron import (Megatron 0.20's
`TargetAllowlist` and its default names and prefixes), for `config.instantiate_utils` and
`models.base` (both read dicts that may come from files)."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_DEFAULT_ALLOWED_PREFIXES: tuple[str, ...] = (
    "megatron.training.",
    "megatron.core.",
    "torch.",
    "transformers.",
    "signal.",
    "gigatron.training.",
    "gigatron.core.",
)
_DEFAULT_ALLOWED_EXACT: frozenset[str] = frozenset({"functools.partial"})


class TargetAllowlist:
    """Which `_target_` names a config may use: module prefixes (ending in '.') and exact names."""

    def __init__(self) -> None:
        self._allowed_prefixes: list[str] = list(_DEFAULT_ALLOWED_PREFIXES)
        self._allowed_exact: set[str] = set(_DEFAULT_ALLOWED_EXACT)
        self._enabled = True

    def is_allowed(self, target: str) -> bool:
        """Whether `target` may be imported (always, while disabled)."""
        if not self._enabled:
            return True
        return target in self._allowed_exact or any(
            target.startswith(p) for p in self._allowed_prefixes
        )

    def is_vouched_for(self, target: str) -> bool:
        """Whether the program itself admitted `target` (an added prefix or exact name, or the
        list disabled): then gigatron does not check what kind of object it is."""
        if not self._enabled:
            return True
        if target in self._allowed_exact - _DEFAULT_ALLOWED_EXACT:
            return True
        added = [p for p in self._allowed_prefixes if p not in _DEFAULT_ALLOWED_PREFIXES]
        return any(target.startswith(p) for p in added)

    def add_prefix(self, prefix: str) -> None:
        if not prefix.endswith("."):
            raise ValueError(f"Prefix must end with '.': got '{prefix}'")
        if prefix not in self._allowed_prefixes:
            self._allowed_prefixes.append(prefix)

    def remove_prefix(self, prefix: str) -> None:
        """ValueError if `prefix` is not in the list."""
        self._allowed_prefixes.remove(prefix)

    def add_exact(self, target: str) -> None:
        self._allowed_exact.add(target)

    def remove_exact(self, target: str) -> None:
        self._allowed_exact.discard(target)

    def disable(self) -> None:
        logger.warning("Target allowlist has been disabled: any _target_ will be imported")
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def enabled(self) -> bool:
        return self._enabled

    @property
    def allowed_prefixes(self) -> tuple[str, ...]:
        return tuple(self._allowed_prefixes)

    @property
    def allowed_exact(self) -> frozenset[str]:
        return frozenset(self._allowed_exact)


target_allowlist = TargetAllowlist()
