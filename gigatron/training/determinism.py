"""Settings for bit-exact reproducible runs (mirrors `megatron.training.determinism`).

`apply_determinism_env(env)` checks the determinism-related environment variables a user set
and fills in the canonical values for the unset ones; it must run before the first NCCL
communicator, cuBLAS handle or Transformer Engine kernel, which read them once.
`apply_determinism_to_args(args)` checks the flags a deterministic run forbids, applies the
environment to `os.environ` and turns on `torch.use_deterministic_algorithms`.
On gigatron's CPU path only `torch.use_deterministic_algorithms` changes anything; the
variables matter to CUDA libraries and are set the same way for them.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

import torch

ARG_VALUES_REQUIRED_FOR_DETERMINISM = {"cross_entropy_loss_fusion": False, "tp_comm_overlap": False}

DETERMINISM_ENV_VAR_DEFAULTS: dict[str, str] = {
    "NCCL_ALGO": "Ring",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
}

# NCCL algorithms whose reductions add in a fixed order ("^NVLS": anything but NVLS).
ACCEPTED_NCCL_ALGO_TOKENS: frozenset[str] = frozenset(
    {"Ring", "CollnetDirect", "CollnetChain", "^NVLS"}
)

ACCEPTED_ENV_VAR_VALUES: dict[str, frozenset[str]] = {
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": frozenset({"0"}),
    "CUBLAS_WORKSPACE_CONFIG": frozenset({":4096:8", ":16:8"}),
}

_SSM_SWITCHES = ("MAMBA_DETERMINISTIC", "CAUSAL_CONV1D_DETERMINISTIC")


def apply_determinism_env(env: MutableMapping[str, str]) -> None:
    """Validate the determinism variables set in `env`, then `setdefault` the canonical ones.

    NCCL_ALGO: every comma-separated token in ACCEPTED_NCCL_ALGO_TOKENS.
    NVTE_ALLOW_NONDETERMINISTIC_ALGO / CUBLAS_WORKSPACE_CONFIG: a value in
    ACCEPTED_ENV_VAR_VALUES. MAMBA_DETERMINISTIC / CAUSAL_CONV1D_DETERMINISTIC: when set and
    non-empty, starting with '1'. A value the caller set is never overwritten.
    Raises ValueError naming the variable and the accepted values.
    """
    nccl_algo = env.get("NCCL_ALGO")
    if nccl_algo is not None:
        tokens = [t.strip() for t in nccl_algo.split(",") if t.strip()]
        if not tokens or any(t not in ACCEPTED_NCCL_ALGO_TOKENS for t in tokens):
            raise ValueError(
                f"NCCL_ALGO={nccl_algo!r}: each token must be in "
                f"{sorted(ACCEPTED_NCCL_ALGO_TOKENS)} for a deterministic run"
            )
    for name, accepted in ACCEPTED_ENV_VAR_VALUES.items():
        value = env.get(name)
        if value is not None and value not in accepted:
            raise ValueError(
                f"{name}={value!r} is not a deterministic setting; accepted: {sorted(accepted)}"
            )
    for name in _SSM_SWITCHES:
        value = env.get(name)
        if value and not value.startswith("1"):
            raise ValueError(
                f"{name}={value!r} turns SSM determinism off under --deterministic-mode; "
                "unset it or set it to '1'"
            )
    for name, value in DETERMINISM_ENV_VAR_DEFAULTS.items():
        env.setdefault(name, value)


def apply_determinism_to_args(args) -> None:
    """--deterministic-mode: reject flags that break it (never changes them), apply the
    environment to `os.environ`, turn on torch's deterministic algorithms. Idempotent."""
    wrong = [
        f"{name}={required!r} (got {getattr(args, name)!r})"
        for name, required in ARG_VALUES_REQUIRED_FOR_DETERMINISM.items()
        if getattr(args, name) != required
    ]
    if wrong:
        raise ValueError(f"--deterministic-mode requires: {', '.join(wrong)}")
    apply_determinism_env(os.environ)
    torch.use_deterministic_algorithms(True)
