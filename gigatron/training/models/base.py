"""`Serializable`: what `ConfigContainerBase.to_dict` writes through the object's own methods."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Serializable(Protocol):
    """An object written as `as_dict()` (a dict whose `_target_` names its class) and read back
    by the class's `from_dict(data)`. Structural: any object with both methods is one."""

    def as_dict(self) -> dict[str, Any]: ...

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Serializable: ...
