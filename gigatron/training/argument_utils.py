"""Command-line flags declared by config dataclasses, and configs filled back from parsed flags.

Mirrors `megatron.training.argument_utils` (Megatron 0.20): `ArgumentGroupFactory` turns each
field of a dataclass into one argparse flag (`--field-name`), its type read from the annotation,
its default from the field and its help from the string literal under the field; a field's
`metadata["argparse_meta"]` dict overrides any inferred `add_argument` keyword (plus `arg_names`).
`_default_config_from_args` and `pretrain_cfg_container_from_args` go the other way: a config
from the parsed namespace by field name.

Type rules (Megatron's): `int`/`float`/`str` -> that type; `X | None` -> X; `list[X]` ->
`nargs="+"`; `Literal[...]` -> `choices`; an Enum -> its member names looked up by name; `bool`
-> `store_true` when the default is False, else `store_false` under `--no-x` and `--disable-x`.
Anything else (a Union of two types, a Callable) raises `TypeInferenceError` unless the field's
argparse_meta says how to parse it (then a warning is printed and the metadata is used).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import enum
import inspect
import textwrap
import types
import typing
import warnings
from argparse import ArgumentParser, Namespace, _ArgumentGroup
from typing import Any

from gigatron.training._config_from_args import (  # noqa: F401  (Megatron's name here)
    core_transformer_config_from_args,
    ddp_config_from_args,
    optimizer_config_from_args,
)
from gigatron.training.config import (
    CheckpointConfig,
    DistributedInitConfig,
    LoggerConfig,
    PretrainConfigContainer,
    ProfilingConfig,
    RerunStateMachineConfig,
    RNGConfig,
    SchedulerConfig,
    TokenizerConfig,
    TrainingConfig,
    ValidationConfig,
)


class TypeInferenceError(Exception):
    """A field's annotation has no argparse meaning (a Union, a Callable, a multi-type list)."""


class ArgumentGroupFactory:
    """Add one argparse group holding a flag per field of `src_cfg_class` (a dataclass type).

    `exclude` names fields to leave out; fields with `init=False` are always left out.
    Subclass it for configs needing more handling (Megatron's advice too).
    """

    def __init__(self, src_cfg_class: type, exclude: list[str] | None = None) -> None:
        self.src_cfg_class = src_cfg_class
        self.field_docstrings = self._get_field_docstrings(src_cfg_class)
        self.exclude = set(exclude or ())
        # annotations written as strings (`from __future__ import annotations`) resolved once
        try:
            self._hints = typing.get_type_hints(src_cfg_class)
        except (NameError, TypeError):  # a name only a function's locals knew: read field.type
            self._hints = {}

    def _format_arg_name(self, config_attr_name: str, prefix: str | None = None) -> str:
        """`foo_bar` -> `--foo-bar`; with prefix 'no' -> `--no-foo-bar`."""
        name = f"{prefix}_{config_attr_name}" if prefix else config_attr_name
        return "--" + name.replace("_", "-")

    def _get_enum_kwargs(self, config_type: enum.EnumMeta) -> dict[str, Any]:
        """An Enum flag takes a member name (`--x SIGINT`); an unknown name raises KeyError."""

        def by_name(cli_arg):
            return config_type[cli_arg]

        return {"type": by_name, "choices": list(config_type)}

    def _extract_type(self, config_type) -> dict[str, Any]:
        """argparse `type` / `nargs` / `choices` for one annotation (module docstring's rules)."""
        if isinstance(config_type, type) and issubclass(config_type, enum.Enum):
            return self._get_enum_kwargs(config_type)
        origin, inner = typing.get_origin(config_type), typing.get_args(config_type)
        if origin is None:
            return {"type": config_type}
        if origin in (typing.Union, types.UnionType):
            if len(inner) == 2 and inner[1] is type(None):
                return self._extract_type(inner[0])
            raise TypeInferenceError(f"Unions not supported by argparse: {config_type}")
        if origin is list:
            if len(inner) != 1:
                raise TypeInferenceError(
                    f"Multi-type lists not supported by argparse: {config_type}"
                )
            return {**self._extract_type(inner[0]), "nargs": "+"}
        if origin is typing.Literal:
            kinds = {type(choice) for choice in inner}
            if len(kinds) != 1:
                raise TypeInferenceError(f"Literal choices of mixed types: {config_type}")
            return {"type": kinds.pop(), "choices": inner}
        raise TypeInferenceError(f"Unsupported type: {config_type}")

    def _build_argparse_kwargs_from_field(self, attribute: dataclasses.Field) -> dict[str, Any]:
        """`add_argument` keywords (plus `arg_names`) for one field; argparse_meta wins."""
        kwargs: dict[str, Any] = {
            "arg_names": [self._format_arg_name(attribute.name)],
            "dest": attribute.name,
            "help": self.field_docstrings.get(attribute.name, ""),
        }
        if attribute.default is dataclasses.MISSING and attribute.default_factory is not (
            dataclasses.MISSING
        ):
            kwargs["default"] = attribute.default_factory()
        else:
            kwargs["default"] = attribute.default
        meta = attribute.metadata.get("argparse_meta")
        try:
            kwargs.update(self._extract_type(self._hints.get(attribute.name, attribute.type)))
            if kwargs["type"] is bool:
                del kwargs["type"]
                if attribute.default is False:
                    kwargs["action"] = "store_true"
                else:
                    kwargs["action"] = "store_false"
                    kwargs["arg_names"] = [
                        self._format_arg_name(attribute.name, prefix="no"),
                        self._format_arg_name(attribute.name, prefix="disable"),
                    ]
        except TypeInferenceError as e:
            if meta is None:
                raise
            print(
                f"WARNING: no argparse type for {self.src_cfg_class.__name__}.{attribute.name} "
                f"({attribute.type}); using its argparse_meta ({e})"
            )
        if meta is not None:
            kwargs.update(meta)
        return kwargs

    def build_group(self, parser: ArgumentParser, title: str | None = None) -> _ArgumentGroup:
        """Add the group (described by the class docstring) and its flags to `parser`."""
        group = parser.add_argument_group(title=title, description=self.src_cfg_class.__doc__)
        for attribute in dataclasses.fields(self.src_cfg_class):
            if attribute.name in self.exclude or not attribute.init:
                continue
            kwargs = self._build_argparse_kwargs_from_field(attribute)
            group.add_argument(*kwargs.pop("arg_names"), **kwargs)
        return group

    def _get_field_docstrings(self, src_cfg_class: type) -> dict[str, str]:
        """field name -> the string literal right under it, whitespace folded to one line;
        a subclass's strings win over its first base class's (read recursively)."""
        found: dict[str, str] = {}
        bases = src_cfg_class.__bases__
        if bases and bases[0].__name__ not in builtins.__dict__:
            found.update(self._get_field_docstrings(bases[0]))
        try:
            source = textwrap.dedent(inspect.getsource(src_cfg_class))
        except (OSError, TypeError):  # a class built at run time has no source to read
            return found
        body = ast.parse(source).body[0].body
        for node, after in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                found[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
        return found


def _default_config_from_args(cls: type, args: Namespace, return_instance: bool = True) -> Any:
    """`cls(**{f: args.f})` for every field of `cls` that `args` has (the rest keep defaults);
    with return_instance=False the keyword dict instead."""
    kwargs = {
        f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)
    }
    return cls(**kwargs) if return_instance else kwargs


def _checkpoint_config_from_args(args: Namespace) -> CheckpointConfig:
    """The checkpoint flags whose name differs from their field: `--no-*` switches invert."""
    kw = _default_config_from_args(CheckpointConfig, args, return_instance=False)
    kw["save_optim"] = not args.no_save_optim
    kw["save_rng"] = not args.no_save_rng
    kw["load_optim"] = not args.no_load_optim
    kw["load_rng"] = not args.no_load_rng
    kw["fully_parallel_save"] = args.ckpt_fully_parallel_save
    kw["fully_parallel_load"] = args.ckpt_fully_parallel_load
    return CheckpointConfig(**kw)


def pretrain_cfg_container_from_args(args: Namespace, model_cfg=None) -> PretrainConfigContainer:
    """All training configs of a run from its parsed flags (Megatron's helper of this name):
    each config by field name, the optimizer / DDP configs as `gigatron.training.training`'s
    `get_megatron_optimizer_config` / `get_megatron_ddp_config` build them, and the renamed flags
    (`--no-save-optim`, `--profile`, `--check-for-nan-in-loss-and-grad`, ...) mapped."""
    if model_cfg is None:
        warnings.warn("pretrain_cfg_container_from_args: no model config given", stacklevel=2)
    profiling = _default_config_from_args(ProfilingConfig, args, return_instance=False)
    profiling["use_nsys_profiler"] = args.profile
    rerun = _default_config_from_args(RerunStateMachineConfig, args, return_instance=False)
    rerun["check_for_nan_in_loss"] = args.check_for_nan_in_loss_and_grad
    optimizer = optimizer_config_from_args(args)  # training.get_megatron_optimizer_config's
    return PretrainConfigContainer(
        train=_default_config_from_args(TrainingConfig, args),
        validation=_default_config_from_args(ValidationConfig, args),
        model=model_cfg,
        optimizer=optimizer,
        scheduler=_default_config_from_args(SchedulerConfig, args),
        ddp=ddp_config_from_args(args),
        dist=_default_config_from_args(DistributedInitConfig, args),
        rng=_default_config_from_args(RNGConfig, args),
        logger=_default_config_from_args(LoggerConfig, args),
        checkpoint=_checkpoint_config_from_args(args),
        profiling=ProfilingConfig(**profiling),
        tokenizer=_default_config_from_args(TokenizerConfig, args),
        rerun_state_machine=RerunStateMachineConfig(**rerun),
        straggler=None,  # gigatron has no straggler detection
    )
