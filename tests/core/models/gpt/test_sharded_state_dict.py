"""GPTModel.sharded_state_dict() is megatron-core 0.16.1's, entry by entry.

On each rank gigatron's and megatron-core's GPTModel (local spec, same config, built side by side
on CPU in one process) give dicts with the same keys, and every value the same kind
(ShardedTensor / ShardedTensorFactory / ShardedObject) with the same checkpoint key, local and
global shape, global offset, prepended axes, replica id, axis fragmentation and shape-mismatch
flag (a factory: the same for everything it builds); the keys are the module's own `state_dict()`
keys (less `output_layer._extra_state`, which megatron-core's GPT drops). Layouts: TP 1, TP 2,
PP 2 with tied embeddings (the last stage's copy), PP 2 x VPP 2 (the global layer index of each
virtual chunk's layers in the stacked-layer offset), per-layer keys (`non_homogeneous_layers`),
MoE (SequentialMLP) at EP 2, TP 2 x EP 2, and MoE on every second layer (per-layer keys).
GroupedMLP (megatron-core's needs the grouped_gemm package) is checked against the rule it
shares with megatron-core: its factories build SequentialMLP's checkpoint tensors.
"""

import pytest
import torch
import torch.nn.functional as F

from gigatron.testing import run_distributed
from tests.core.models._sharded_structure import describe, differences

pytestmark = pytest.mark.multirank


pytest.importorskip("megatron.core.models.gpt")

KW = dict(
    num_layers=2, hidden_size=32, num_attention_heads=8, num_query_groups=4, ffn_hidden_size=48,
    normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
    hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
)  # fmt: skip
MOE = dict(
    num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32,
    moe_token_dispatcher_type="allgather",  # megatron-core's alltoall makes a CUDA stream
)  # fmt: skip


def _megatron_side_effects():
    """What megatron-core needs from CUDA on a CPU-only torch, stubbed."""
    if torch.cuda.is_available():
        return
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.current_device = lambda: "cpu"
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # its PP weight tying moves to CUDA
    mrandom._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    mrandom.get_cuda_rng_tracker().states_["model-parallel-rng"] = torch.get_rng_state()
    mrandom.get_cuda_rng_tracker().states_["expert-parallel-rng"] = torch.get_rng_state()


def _both(tp=1, pp=1, vpp=None, ep=1, moe=False, tied=False, num_layers=2, metadata=None, **extra):
    """(gigatron's describe, megatron-core's describe, gigatron's dict keys == its own
    state_dict keys less output_layer._extra_state) on this rank (of every virtual pipeline
    chunk under VPP, keys prefixed `chunk<v>/`)."""
    from megatron.core import parallel_state as mps
    from megatron.core.models.gpt import GPTModel as MGPT
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec as mspec
    from megatron.core.transformer.transformer_config import TransformerConfig as MTC

    from gigatron.core import parallel_state as ps
    from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from gigatron.core.models.gpt.gpt_model import GPTModel
    from gigatron.core.transformer.transformer_config import TransformerConfig

    sizes = dict(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    sizes["virtual_pipeline_model_parallel_size"] = vpp
    mps.initialize_model_parallel(**sizes, expert_model_parallel_size=ep)
    ps.initialize_model_parallel(**sizes, expert_model_parallel_size=ep)
    _megatron_side_effects()
    kw = dict(KW, **sizes, num_layers=num_layers, **(MOE if moe else {}), **extra)
    if moe:
        kw["expert_model_parallel_size"] = ep
    if pp > 1:
        kw["pipeline_dtype"] = torch.float32
    experts = MOE["num_moe_experts"] if moe else None
    ours, theirs, own_keys = {}, {}, True
    for v in range(vpp or 1):
        vp_stage = v if vpp else None
        model_kw = dict(
            position_embedding_type="rope",
            share_embeddings_and_output_weights=tied,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=vpp is None, vp_stage=vp_stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=vpp is None, vp_stage=vp_stage),
            vp_stage=vp_stage,
        )
        torch.manual_seed(0)
        m = MGPT(MTC(**kw), mspec(num_experts=experts), 64, 8, **model_kw)
        torch.manual_seed(0)
        g = GPTModel(TransformerConfig(**kw), get_gpt_layer_local_spec(experts), 64, 8, **model_kw)
        sd = g.sharded_state_dict(metadata=metadata)
        own_keys &= set(g.state_dict()) - {"output_layer._extra_state"} == set(sd)
        chunk = f"chunk{v}/" if vpp else ""
        ours.update({chunk + k: x for k, x in describe(sd).items()})
        msd = m.sharded_state_dict(metadata=dict(metadata or {}))
        theirs.update({chunk + k: x for k, x in describe(msd).items()})
    mps.destroy_model_parallel()
    return ours, theirs, own_keys


def _compare(case: dict):
    ours, theirs, own_keys = _both(**case)
    return differences(ours, theirs), own_keys, len(ours)


CASES = {
    "tp1": (1, dict()),
    "tp2": (2, dict(tp=2)),
    "pp2_tied": (2, dict(pp=2, tied=True)),
    "pp2_vpp2": (2, dict(pp=2, vpp=2, num_layers=4)),
    "tp2_per_layer_keys": (2, dict(tp=2, metadata={"non_homogeneous_layers": True})),
    "moe_ep2": (2, dict(moe=True, ep=2)),
    "moe_tp2_ep2": (4, dict(moe=True, tp=2, ep=2)),
    "moe_every_second_layer": (1, dict(moe=True, num_layers=4, moe_layer_freq=2)),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(CASES))
def test_gpt_sharded_state_dict_equals_megatron_cores(name):
    world, case = CASES[name]
    for rank, (diff, own_keys, n) in enumerate(
        run_distributed(_compare, world, args=(case,), timeout=240)
    ):
        assert diff == [], f"rank {rank}:\n" + "\n".join(diff[:20])
        assert own_keys and n > 0, rank


def _moe_gpt(grouped: bool, seed: int):
    from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from gigatron.core.models.gpt.gpt_model import GPTModel
    from gigatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(
        **dict(KW, **MOE, moe_grouped_gemm=grouped), tensor_model_parallel_size=2,
        expert_model_parallel_size=2, sequence_parallel=True,
    )  # fmt: skip
    torch.manual_seed(seed)  # CPU init draws the same experts for either module
    spec = get_gpt_layer_local_spec(MOE["num_moe_experts"], moe_grouped_gemm=grouped)
    return GPTModel(cfg, spec, 64, 8, position_embedding_type="rope").eval()


def _grouped_and_sequential(root: str):
    """Each module saves with the snippet; each loads the other's checkpoint: max |logits -
    the saving model's logits| (gathered over TP)."""
    import torch.distributed as dist

    from gigatron.core import dist_checkpointing, parallel_state

    parallel_state.initialize_model_parallel(2, expert_model_parallel_size=2)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))

    def logits(model):
        with torch.no_grad():
            local = model(ids, None, None)  # [b, s, V/tp]
        group = parallel_state.get_tensor_model_parallel_group()
        parts = [torch.empty_like(local) for _ in range(2)]
        dist.all_gather(parts, local.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    saved = {}
    for grouped in (False, True):
        model = _moe_gpt(grouped, seed=grouped)  # different weights per module
        dist_checkpointing.save(model.sharded_state_dict(), f"{root}/{grouped}")
        saved[grouped] = logits(model)
    errs = {}
    for grouped in (False, True):
        model = _moe_gpt(grouped, seed=7)
        request = model.sharded_state_dict()
        model.load_state_dict(dist_checkpointing.load(request, f"{root}/{not grouped}"))
        errs[grouped] = (logits(model) - saved[not grouped]).abs().max().item()
    return errs, (saved[False] - saved[True]).abs().max().item()


def test_grouped_mlp_and_sequential_mlp_load_each_others_checkpoints(tmp_path):
    """megatron-core's rule: GroupedMLP saves SequentialMLP's global expert tensors (TP 2 x EP 2
    with expert TP), so each module loads the other's checkpoint and gives its logits."""
    import os

    from gigatron.core import dist_checkpointing

    for grouped in (False, True):
        os.makedirs(tmp_path / str(grouped))
    results = run_distributed(_grouped_and_sequential, 4, args=(str(tmp_path),), timeout=240)
    for errs, apart in results:
        assert apart > 1e-3  # the two saved models differ
        assert errs[False] < 1e-5 and errs[True] < 1e-5, errs
    seq = dist_checkpointing.load_tensors_metadata(str(tmp_path / "False"))
    grouped = dist_checkpointing.load_tensors_metadata(str(tmp_path / "True"))
    assert {k: v.global_shape for k, v in seq.items()} == {
        k: v.global_shape for k, v in grouped.items()
    }
    assert seq["decoder.layers.mlp.experts.experts.linear_fc1.weight"].global_shape == (
        2, 4, 64, 32
    )  # fmt: skip
