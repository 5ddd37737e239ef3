"""--deterministic-mode refuses --use-flash-attn as Megatron's validate_args does ("Flash
attention can not be used in deterministic mode"); each flag alone still parses."""

import pytest

from tests.training.test_compat_flags import _args


def test_deterministic_mode_refuses_flash_attention(monkeypatch):
    monkeypatch.delenv("NCCL_ALGO", raising=False)
    refusal = "--deterministic-mode cannot be used with --use-flash-attn"
    with pytest.raises(ValueError, match=refusal):
        _args("--deterministic-mode", "--use-flash-attn", "--distributed-backend", "gloo")
    assert _args("--deterministic-mode", "--distributed-backend", "gloo").deterministic_mode
    assert _args("--use-flash-attn").use_flash_attn
