"""`ProcessGroupCollection`: the process groups a module uses, passed explicitly.

Mirrors `megatron.core.process_groups_config`. Modules accept `pg_collection=None` and fall back
to `parallel_state` when it is None; `use_mpu_process_groups()` builds one from parallel_state.
The GTP weight-sharding fields of megatron-core 0.19 hold what Megatron builds at GTP size 1, the
only size gigatron builds: singleton `gtp_remat` / `expt_gtp_remat` groups, and the
`*_gtp_remat` / `*_with_egtp_remat` groups equal to their plain twins (`dp_cp`, `expt_dp`,
`tp_ep_pp`). `MultiModuleProcessGroupCollection` names one collection per module of a
multi-module pipeline (gigatron's schedules refuse it: no cross-grid schedule).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields

from gigatron.core import parallel_state as ps


@dataclass(init=False)
class ProcessGroupCollection:
    """Named process groups (Megatron's field names); unset fields read as None."""

    tp: object = field(init=False, default=None)
    pp: object = field(init=False, default=None)
    mp: object = field(init=False, default=None)
    embd: object = field(init=False, default=None)
    pos_embd: object = field(init=False, default=None)
    cp: object = field(init=False, default=None)
    tp_cp: object = field(init=False, default=None)
    hcp: object = field(init=False, default=None)
    ep: object = field(init=False, default=None)
    expt_tp: object = field(init=False, default=None)
    tp_ep: object = field(init=False, default=None)
    tp_ep_pp: object = field(init=False, default=None)
    tp_ep_pp_with_egtp_remat: object = field(init=False, default=None)
    tp_dp_cp: object = field(init=False, default=None)
    dp: object = field(init=False, default=None)
    dp_cp: object = field(init=False, default=None)
    dp_cp_gtp_remat: object = field(init=False, default=None)
    dp_cp_ag: object = field(init=False, default=None)
    gtp_remat: object = field(init=False, default=None)
    expt_gtp_remat: object = field(init=False, default=None)
    expt_dp: object = field(init=False, default=None)
    expt_dp_gtp_remat: object = field(init=False, default=None)
    expt_dp_ag: object = field(init=False, default=None)
    intra_dp_cp: object = field(init=False, default=None)
    intra_expt_dp: object = field(init=False, default=None)
    inter_dist_opt: object = field(init=False, default=None)
    intra_dist_opt: object = field(init=False, default=None)

    def __init__(self, **groups) -> None:
        valid = {f.name for f in fields(self)}
        for name, group in groups.items():
            if name not in valid:
                raise ValueError(
                    f"unknown process group {name!r} for ProcessGroupCollection; "
                    f"valid names: {sorted(valid)}"
                )
            setattr(self, name, group)

    def __repr__(self) -> str:
        """The groups that are set, with their sizes: `ProcessGroupCollection(tp(2), hcp([2, 4]))`
        (Megatron's form; `ProcessGroupCollection(empty)` when none is)."""
        active = []
        for f in fields(self):
            pg = getattr(self, f.name)
            if pg is None:
                continue
            sizes = [g.size() for g in pg] if isinstance(pg, list) else pg.size()
            active.append(f"{f.name}({sizes})")
        return f"ProcessGroupCollection({', '.join(active) or 'empty'})"

    @classmethod
    def use_mpu_process_groups(cls, required_pgs: list[str] | None = None):
        """A collection holding parallel_state's groups (all of them, or `required_pgs`)."""
        getters = {
            "tp": ps.get_tensor_model_parallel_group,
            "pp": ps.get_pipeline_model_parallel_group,
            "mp": ps.get_model_parallel_group,
            "cp": ps.get_context_parallel_group,
            "tp_cp": ps.get_tensor_and_context_parallel_group,
            "ep": ps.get_expert_model_parallel_group,
            "expt_tp": ps.get_expert_tensor_parallel_group,
            "tp_ep": ps.get_expert_tensor_and_model_parallel_group,
            "tp_ep_pp": ps.get_expert_tensor_model_pipeline_parallel_group,
            "tp_ep_pp_with_egtp_remat": lambda: ps.get_expert_tensor_model_pipeline_parallel_group(
                with_egtp_remat=True
            ),
            "tp_dp_cp": lambda: ps.get_tensor_and_data_parallel_group(with_context_parallel=True),
            "dp": ps.get_data_parallel_group,
            "dp_cp": lambda: ps.get_data_parallel_group(with_context_parallel=True),
            "dp_cp_gtp_remat": lambda: ps.get_data_parallel_group(with_context_parallel=True),
            "dp_cp_ag": lambda: None,  # Megatron's too: a separate AG communicator is opt-in
            "gtp_remat": ps.get_gtp_weight_remat_group,
            "expt_gtp_remat": ps.get_expert_gtp_weight_remat_group,
            "expt_dp": ps.get_expert_data_parallel_group,
            "expt_dp_gtp_remat": ps.get_expert_data_parallel_group,
            "expt_dp_ag": lambda: None,
            "intra_dp_cp": lambda: ps.get_data_parallel_group(with_context_parallel=True),
            "intra_expt_dp": ps.get_expert_data_parallel_group,
            "embd": lambda: ps.get_embedding_group() if ps.is_rank_in_embedding_group() else None,
            "pos_embd": lambda: (
                ps.get_position_embedding_group()
                if ps.is_rank_in_position_embedding_group()
                else None
            ),
        }
        names = list(getters) if required_pgs is None else required_pgs
        unknown = [n for n in names if n not in getters]
        if unknown:
            raise ValueError(
                f"Invalid process groups requested: {unknown}; parallel_state builds "
                f"{sorted(getters)}"
            )
        return cls(**{n: getters[n]() for n in names})


@dataclass
class MultiModuleProcessGroupCollection:
    """One `ProcessGroupCollection` per module of a rank in a multi-module pipeline (e.g. an
    encoder and the language model colocated); `language_model_module_name` names the LLM's."""

    module_pgs: dict[str, ProcessGroupCollection]
    language_model_module_name: str | None = None

    def __post_init__(self) -> None:
        if not self.module_pgs:
            raise ValueError("module_pgs dict cannot be empty")
        name = self.language_model_module_name
        if name is not None and name not in self.module_pgs:
            raise ValueError(
                f"language_model_module_name {name!r} not found in module_pgs keys: "
                f"{list(self.module_pgs)}"
            )

    def get_language_model_collection(self) -> ProcessGroupCollection:
        if self.language_model_module_name is None:
            raise ValueError("No language model specified for this collection")
        return self.module_pgs[self.language_model_module_name]

    def get_language_model_cp_size(self) -> int:
        return self.get_language_model_collection().cp.size()

    def has_language_model(self) -> bool:
        return self.language_model_module_name is not None

    def get_module_collection(self, module_name: str) -> ProcessGroupCollection:
        if module_name not in self.module_pgs:
            raise ValueError(
                f"Module {module_name!r} not found in collections. "
                f"Available: {list(self.module_pgs)}"
            )
        return self.module_pgs[module_name]

    def __len__(self) -> int:
        return len(self.module_pgs)

    def __getitem__(self, module_name: str) -> ProcessGroupCollection:
        return self.module_pgs[module_name]

    def __iter__(self) -> Iterator[ProcessGroupCollection]:
        return iter(self.module_pgs.values())

    def keys(self):
        return self.module_pgs.keys()

    def values(self):
        return self.module_pgs.values()

    def items(self):
        return self.module_pgs.items()

    def __repr__(self) -> str:
        lm = self.language_model_module_name
        lm_str = f", language_model_module_name={lm!r}" if lm else ""
        return f"MultiModuleProcessGroupCollection(modules=[{', '.join(self.module_pgs)}]{lm_str})"
