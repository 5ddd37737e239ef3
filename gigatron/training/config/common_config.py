"""Random seed, profiling and process-group start-up settings (Megatron's common_config)."""

from dataclasses import dataclass, field
from typing import Literal


@dataclass(kw_only=True)
class RNGConfig:
    """Random number generation."""

    seed: int = 1234
    """Seed of Python, NumPy and torch (each pipeline stage offsets it) and of the data order."""


@dataclass(kw_only=True)
class ProfilingConfig:
    """Profiling of a window of iterations."""

    use_nsys_profiler: bool = field(
        default=False, metadata={"argparse_meta": {"arg_names": ["--profile"], "dest": "profile"}}
    )
    """Profile iterations --profile-step-start .. --profile-step-end (gigatron: torch.profiler;
    without --use-pytorch-profiler a CUDA range an external nsys can capture)."""

    profile_step_start: int = 10
    """First profiled iteration."""

    profile_step_end: int = 12
    """Iteration at which profiling stops."""

    use_pytorch_profiler: bool = False
    """Write a torch.profiler trace into --tensorboard-dir."""

    profile_ranks: list[int] = field(default_factory=lambda: [0])
    """Global ranks to profile (gigatron's default [0]; Megatron's [] means every rank)."""


@dataclass(kw_only=True)
class DistributedInitConfig:
    """How the default process group starts."""

    distributed_backend: Literal["nccl", "gloo"] | None = None
    """nccl | gloo (gigatron's default None: nccl with GPUs, else gloo; Megatron's: nccl)."""

    distributed_timeout_minutes: int = 10
    """Timeout of collectives, in minutes."""

    local_rank: int | None = None
    """Set by old launchers; accepted, no effect: gigatron reads LOCAL_RANK / RANK from the
    environment."""

    use_megatron_fsdp: bool = False
    """Megatron-FSDP (gigatron: on PyTorch's FSDP2) with --data-parallel-sharding-strategy.
    Cannot be used together with use_torch_fsdp2."""

    use_torch_fsdp2: bool = False
    """PyTorch's FSDP2 (`fully_shard`) over the data-parallel group; no PP, no EP."""
