"""GPTModelProvider: a HF model's TransformerConfig, set up before the model is built.

Mirrors Megatron-Bridge's `megatron.bridge.models.gpt_provider.GPTModelProvider` as users call it:
`AutoBridge.to_megatron_provider()` returns one; set parallel sizes (or any other TransformerConfig
field) as attributes, `finalize()` validates them, `provide_distributed_model()` builds this
rank's model chunks (one per virtual pipeline stage) and `provide()` one chunk. Megatron-Bridge's
provider *is* a TransformerConfig subclass; here it holds the family's config kwargs plus your
overrides and builds the TransformerConfig at `finalize()`, so an unknown attribute is a
ValueError instead of a silently ignored field. The vocabulary is padded for the final TP size
(`make_vocab_size_divisible_by` x tensor_model_parallel_size, Megatron's rule).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch.distributed as dist

from gigatron.convert.hf_config import HFModelSpec, spec_from_hf_config
from gigatron.core import parallel_state as ps
from gigatron.core import tensor_parallel
from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from gigatron.core.models.gpt import GPTModel
from gigatron.core.transformer.module import Float16Module
from gigatron.core.transformer.transformer_config import MLATransformerConfig

_CONFIG_FIELDS = {f.name for f in dataclasses.fields(MLATransformerConfig)}
_OWN_FIELDS = {"make_vocab_size_divisible_by"}
_LAYOUT = (
    ("tensor_model_parallel_size", ps.get_tensor_model_parallel_world_size),
    ("pipeline_model_parallel_size", ps.get_pipeline_model_parallel_world_size),
    ("context_parallel_size", ps.get_context_parallel_world_size),
    ("expert_model_parallel_size", ps.get_expert_model_parallel_world_size),
)


class GPTModelProvider:
    """This HF model's GPTModel: config fields as attributes, then `provide*()`."""

    def __init__(self, spec: HFModelSpec, *, make_vocab_size_divisible_by: int = 128):
        object.__setattr__(self, "_spec", spec)
        object.__setattr__(self, "_overrides", {})
        object.__setattr__(self, "_config", None)
        object.__setattr__(self, "_pre_wrap_hooks", [])
        self.make_vocab_size_divisible_by = make_vocab_size_divisible_by

    # ------------------------------------------------------------------ fields
    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._overrides:
            return self._overrides[name]
        if name in self._spec.config_kwargs:
            return self._spec.config_kwargs[name]
        if name in self._spec.model_kwargs:
            return self._spec.model_kwargs[name]
        if name == "vocab_size":
            return self._spec.vocab_size
        if name in _CONFIG_FIELDS:  # the dataclass default
            f = next(f for f in dataclasses.fields(MLATransformerConfig) if f.name == name)
            return f.default_factory() if f.default is dataclasses.MISSING else f.default
        raise AttributeError(f"GPTModelProvider has no field {name!r}")

    def __setattr__(self, name: str, value) -> None:
        if name not in _CONFIG_FIELDS | _OWN_FIELDS | set(self._spec.model_kwargs):
            raise ValueError(
                f"GPTModelProvider: {name} is not a TransformerConfig field or a GPTModel "
                "argument of this model"
            )
        self._overrides[name] = value
        object.__setattr__(self, "_config", None)  # finalize() again

    def __dir__(self):
        return sorted(set(super().__dir__()) | _CONFIG_FIELDS | set(self._overrides))

    # --------------------------------------------------------------- building
    def finalize(self):
        """Validate the fields (TransformerConfig's own checks); returns the config."""
        config_fields = {k: v for k, v in self._overrides.items() if k in _CONFIG_FIELDS}
        tp = config_fields.get("tensor_model_parallel_size", 1)
        spec = spec_from_hf_config(
            self._spec.hf_config,
            tensor_model_parallel_size=tp,
            make_vocab_size_divisible_by=self._overrides["make_vocab_size_divisible_by"],
        )
        config = spec.transformer_config(**{"use_cpu_initialization": True, **config_fields})
        object.__setattr__(self, "_finalized_spec", spec)
        object.__setattr__(self, "_config", config)
        return config

    @property
    def config(self):
        """The TransformerConfig (finalized on first use)."""
        return self._config or self.finalize()

    def initialize_model_parallel(self, seed: int | None = None) -> None:
        """parallel_state's groups for this provider's sizes (torch.distributed must be up);
        `seed` seeds the model-parallel RNG (`model_parallel_cuda_manual_seed`)."""
        c = self.config
        ps.initialize_model_parallel(
            c.tensor_model_parallel_size,
            c.pipeline_model_parallel_size,
            c.virtual_pipeline_model_parallel_size,
            context_parallel_size=c.context_parallel_size,
            expert_model_parallel_size=c.expert_model_parallel_size,
            expert_tensor_parallel_size=c.expert_tensor_parallel_size,
        )
        if seed is not None:
            tensor_parallel.model_parallel_cuda_manual_seed(seed)

    def provide(self, pre_process=None, post_process=None, vp_stage=None) -> GPTModel:
        """One model chunk for this rank (stage ends from parallel_state unless given)."""
        config = self.config
        spec = self._finalized_spec
        virtual = ps.get_virtual_pipeline_model_parallel_world_size() is not None
        if pre_process is None:
            pre_process = ps.is_pipeline_first_stage(ignore_virtual=not virtual, vp_stage=vp_stage)
        if post_process is None:
            post_process = ps.is_pipeline_last_stage(ignore_virtual=not virtual, vp_stage=vp_stage)
        model_kwargs = {
            **spec.model_kwargs,
            **{k: v for k, v in self._overrides.items() if k in spec.model_kwargs},
        }
        return GPTModel(
            config,
            spec.layer_spec(False, config, vp_stage),
            vocab_size=spec.padded_vocab_size,
            pre_process=pre_process,
            post_process=post_process,
            vp_stage=vp_stage,
            **model_kwargs,
        )

    def register_pre_wrap_hook(self, hook: Callable[[list], list | None]) -> None:
        """`hook(chunks)` runs after the chunks are built, before DDP wraps them (the bridge
        loads HF weights this way); it may return replacement chunks."""
        self._pre_wrap_hooks.append(hook)

    def provide_distributed_model(
        self,
        ddp_config: DistributedDataParallelConfig | None = None,
        *,
        wrap_with_ddp: bool = True,
        fp16: bool | None = None,
        bf16: bool | None = None,
        pre_wrap_hook: Callable[[list], list | None] | None = None,
    ) -> list:
        """This rank's model chunks (one per virtual stage): built, cast to fp16 / bf16
        (Float16Module) when asked, pre-wrap hooks run (HF weights), wrapped in DDP.

        Initialises parallel_state with this provider's sizes when it is not yet; when it is,
        its sizes must equal the provider's."""
        if fp16 is not None:
            self.fp16 = fp16
        if bf16 is not None:
            self.bf16 = bf16
        config = self.config
        self._check_layout(config)
        vp = ps.get_virtual_pipeline_model_parallel_world_size()
        chunks = [self.provide(vp_stage=s if vp is not None else None) for s in range(vp or 1)]
        if config.fp16 or config.bf16:
            chunks = [Float16Module(config, c) for c in chunks]
        for hook in [*self._pre_wrap_hooks, *([pre_wrap_hook] if pre_wrap_hook else [])]:
            chunks = hook(chunks) or chunks
        if not wrap_with_ddp:
            return chunks
        ddp_config = ddp_config or DistributedDataParallelConfig()
        return [
            DistributedDataParallel(config, ddp_config, c, disable_bucketing=i > 0)
            for i, c in enumerate(chunks)
        ]

    def _check_layout(self, config) -> None:
        if not ps.model_parallel_is_initialized():
            if not dist.is_initialized():
                raise ValueError(
                    "provide_distributed_model needs torch.distributed initialised (e.g. "
                    "torch.distributed.init_process_group('gloo') under torchrun)"
                )
            self.initialize_model_parallel()
            return
        for name, getter in _LAYOUT:
            want, have = getattr(config, name), getter()
            if want != have:
                raise ValueError(
                    f"GPTModelProvider: {name} ({want}) differs from parallel_state's ({have}); "
                    "set the provider's sizes to the initialised layout"
                )
