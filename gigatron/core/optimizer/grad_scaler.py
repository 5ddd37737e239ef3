"""Loss scalers for fp16 training; mirrors `megatron.core.optimizer.grad_scaler`.

The loss is multiplied by `scale` before backward; the optimizer divides main grads by it
(`inv_scale`), skips the step when any grad is inf/NaN, and calls `update(found_inf)`.
Dynamic rule (Megatron's): on overflow, reset the growth count and decrement the hysteresis
count; once hysteresis reaches 0, scale = max(scale * backoff_factor, min_scale). After
`growth_interval` clean steps in a row, scale *= growth_factor and hysteresis resets.
"""

from __future__ import annotations

import torch

_FILE = "gigatron/core/optimizer/grad_scaler.py"


class MegatronGradScaler:
    """Base: holds `scale` as a 1-element fp32 tensor."""

    def __init__(self, initial_scale: float):
        if initial_scale <= 0.0:
            raise ValueError(f"initial_scale ({initial_scale}) must be positive ({_FILE})")
        self._scale = torch.tensor([float(initial_scale)], dtype=torch.float32)

    @property
    def scale(self) -> torch.Tensor:
        return self._scale

    @property
    def inv_scale(self) -> torch.Tensor:
        return self._scale.double().reciprocal().float()

    def update(self, found_inf: bool) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state_dict: dict) -> None:
        raise NotImplementedError


class ConstantGradScaler(MegatronGradScaler):
    """Fixed loss scale."""

    def update(self, found_inf: bool) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        pass


class DynamicGradScaler(MegatronGradScaler):
    """Loss scale that backs off on overflow and grows after clean intervals (module doc)."""

    def __init__(
        self,
        initial_scale: float,
        min_scale: float,
        growth_factor: float,
        backoff_factor: float,
        growth_interval: int,
        hysteresis: int,
    ):
        super().__init__(initial_scale)
        checks = [
            (0.0 < min_scale <= initial_scale, "min_scale", min_scale, "in (0, initial_scale]"),
            (growth_factor > 1.0, "growth_factor", growth_factor, "> 1"),
            (0.0 < backoff_factor < 1.0, "backoff_factor", backoff_factor, "in (0, 1)"),
            (growth_interval > 0, "growth_interval", growth_interval, "> 0"),
            (hysteresis > 0, "hysteresis", hysteresis, "> 0"),
        ]
        for ok, name, value, rule in checks:
            if not ok:
                raise ValueError(f"DynamicGradScaler {name} ({value}) must be {rule} ({_FILE})")
        self.min_scale = torch.tensor([float(min_scale)], dtype=torch.float32)
        self.growth_factor = torch.tensor([float(growth_factor)], dtype=torch.float32)
        self.backoff_factor = torch.tensor([float(backoff_factor)], dtype=torch.float32)
        self.growth_interval = growth_interval
        self.hysteresis = hysteresis
        self._growth_tracker = 0
        self._hysteresis_tracker = hysteresis

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self._growth_tracker = 0
            self._hysteresis_tracker -= 1
            if self._hysteresis_tracker <= 0:
                self._scale = torch.max(self._scale * self.backoff_factor, self.min_scale)
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                self._growth_tracker = 0
                self._hysteresis_tracker = self.hysteresis
                self._scale = self._scale * self.growth_factor

    def state_dict(self) -> dict:
        return {
            "scale": self._scale,
            "growth_tracker": self._growth_tracker,
            "hysteresis_tracker": self._hysteresis_tracker,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self._scale = state_dict["scale"].detach().to("cpu", torch.float32).reshape(1)
        self._growth_tracker = state_dict["growth_tracker"]
        self._hysteresis_tracker = state_dict["hysteresis_tracker"]
