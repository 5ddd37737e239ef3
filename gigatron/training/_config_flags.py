"""The `gigatron train` flags declared by `gigatron.training.config`'s dataclasses: one argparse
group per config class (Megatron 0.20's way, `argument_utils.ArgumentGroupFactory`), each flag's
name, type, default and help read from its field. The resume switches are added last, after any
`extra_args_provider` flags, and only where that provider has not taken the name."""

from __future__ import annotations

import dataclasses

from gigatron.training.argument_utils import ArgumentGroupFactory
from gigatron.training.config import (
    CheckpointConfig,
    DistributedInitConfig,
    LoggerConfig,
    ProfilingConfig,
    RerunStateMachineConfig,
    RNGConfig,
    SchedulerConfig,
    TokenizerConfig,
    TrainingConfig,
    ValidationConfig,
)

# (config class, the fields added by `add_resume_flags` instead)
RESUME_FIELDS = (
    (CheckpointConfig, ("use_checkpoint_args",)),
    (SchedulerConfig, ("override_opt_param_scheduler", "use_checkpoint_opt_param_scheduler")),
)

# fields whose flags are declared by hand (two spellings, another dest)
HAND_DECLARED = {RerunStateMachineConfig: ("check_for_nan_in_loss",)}

# group title -> config class whose every field (less RESUME_FIELDS, HAND_DECLARED) is one flag
CONFIG_GROUPS = {
    "training": TrainingConfig,
    "validation": ValidationConfig,
    "learning-rate schedule": SchedulerConfig,
    "random": RNGConfig,
    "tokenizer": TokenizerConfig,
    "checkpoints": CheckpointConfig,
    "logging": LoggerConfig,
    "profiling": ProfilingConfig,
    "distributed": DistributedInitConfig,
    "rerun state machine": RerunStateMachineConfig,
}


def add_config_flags(parser) -> None:
    """One group per `CONFIG_GROUPS` entry, its flags from the class's fields."""
    resume = dict(RESUME_FIELDS)
    for title, cls in CONFIG_GROUPS.items():
        exclude = [*resume.get(cls, ()), *HAND_DECLARED.get(cls, ())]
        ArgumentGroupFactory(cls, exclude=exclude).build_group(parser, title)


def add_resume_flags(parser) -> None:
    """The RESUME_FIELDS flags, into the checkpoints group; a flag whose name an
    extra-args provider already defines is left to it (`gigatron generate` has its own
    --use-checkpoint-args)."""
    group = next(g for g in parser._action_groups if g.title == "checkpoints")
    taken = parser._option_string_actions
    for cls, names in RESUME_FIELDS:
        factory = ArgumentGroupFactory(cls)
        by_name = {f.name: f for f in dataclasses.fields(cls)}
        for name in names:
            kwargs = factory._build_argparse_kwargs_from_field(by_name[name])
            arg_names = kwargs.pop("arg_names")
            if not any(n in taken for n in arg_names):
                group.add_argument(*arg_names, **kwargs)
    if "--override-seed" in taken:
        return
    group.add_argument(
        "--override-seed",
        action="store_true",
        help="gigatron: resuming: take --seed although the checkpoint was saved with another "
        "(the data order is drawn from it: the rest of the run may repeat or skip samples; "
        "without this flag a different --seed is an error)",
    )
