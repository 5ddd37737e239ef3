"""`ProcessGroupCollection`: the process groups a module uses, passed explicitly.

Mirrors `megatron.core.process_groups_config`. Modules accept `pg_collection=None` and fall back
to `parallel_state` when it is None; `use_mpu_process_groups()` builds one from parallel_state.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from gigatron.core import parallel_state as ps

_FIELDS = (
    "tp pp mp embd pos_embd cp tp_cp hcp ep expt_tp tp_ep tp_ep_pp tp_dp_cp dp dp_cp "
    "expt_dp intra_dp_cp intra_expt_dp inter_dist_opt intra_dist_opt"
).split()


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
    tp_dp_cp: object = field(init=False, default=None)
    dp: object = field(init=False, default=None)
    dp_cp: object = field(init=False, default=None)
    expt_dp: object = field(init=False, default=None)
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
            "tp_dp_cp": lambda: ps.get_tensor_and_data_parallel_group(with_context_parallel=True),
            "dp": ps.get_data_parallel_group,
            "dp_cp": lambda: ps.get_data_parallel_group(with_context_parallel=True),
            "expt_dp": ps.get_expert_data_parallel_group,
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
            raise ValueError(f"cannot build process groups {unknown} from parallel_state")
        return cls(**{n: getters[n]() for n in names})
