"""Multi-latent attention + DeepSeek-V3 MoE under TP 2, TP 2 with sequence parallel, and CP 2
equal the TP 1 model: logits and every parameter's gradient, in one spawned 2-rank run.

Each rank first builds the unsharded twin (TP 1, the 2 ranks as data parallel) from the same HF
files and keeps its logits and grads as the oracle (itself checked against transformers), then
rebuilds the model at each layout, loads the HF files (`load_hf_into_model`) and compares: grads
of TP-sharded weights are gathered along their partition dim, grads of weights replicated over
sequence-parallel ranks summed over TP, and under CP every grad is summed over the CP ranks
(each holds its zigzag share of the tokens); the padded vocabulary rows are cut to the real ones.
TP 2 without SP skips the routed experts' grads: Megatron's MoE trains under TP only with SP
(gigatron's MoELayer refuses it in training mode; the models here run in eval mode).
"""

import pytest
import torch

from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank
# The ranks re-import this module: transformers (the HF model) is imported by the test only.
VOCAB, B, S = 100, 2, 16  # as tests/convert/test_deepseek_convert.py


def _full_grads(model, tp_group, cp_group, sp: bool) -> dict:
    import torch.distributed as dist

    out = {}
    for name, p in model.named_parameters():
        g = p.grad.detach().clone()
        if getattr(p, "tensor_model_parallel", False) and dist.get_world_size(tp_group) > 1:
            parts = [torch.empty_like(g) for _ in range(dist.get_world_size(tp_group))]
            dist.all_gather(parts, g.contiguous(), group=tp_group)
            if name.endswith("linear_fc1.weight"):  # GLU: each rank holds [gate_r; up_r]
                halves = [x.chunk(2, dim=0) for x in parts]
                parts = [h[0] for h in halves] + [h[1] for h in halves]
            g = torch.cat(parts, dim=p.partition_dim)
        elif sp and getattr(p, "sequence_parallel", False):
            dist.all_reduce(g, group=tp_group)
        if dist.get_world_size(cp_group) > 1:
            dist.all_reduce(g, group=cp_group)
        if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
            g = g[:VOCAB]
        out[name] = g
    return out


def _rel_err(got, want) -> float:
    """max |got - want| / max(1, max |want|): large embedding grads sum many tokens."""
    return ((got - want).abs().max() / want.abs().max().clamp(min=1.0)).item()


def _run(hf_dir, ids, weight, tp: int, cp: int, sp: bool, ref_logits=None):
    """(logits [b, s/cp, VOCAB], {name: full grad}, this rank's rows of ref_logits) of the
    model at TP tp x CP cp."""
    from gigatron.convert import load_hf_into_model, read_hf_config, spec_from_hf_config
    from gigatron.core import parallel_state as ps
    from gigatron.core import tensor_parallel
    from gigatron.core.utils import get_batch_on_this_cp_rank

    ps.initialize_model_parallel(tp, 1, context_parallel_size=cp)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    spec = spec_from_hf_config(read_hf_config(hf_dir), tensor_model_parallel_size=tp)
    model = spec.build_model(
        tensor_model_parallel_size=tp, context_parallel_size=cp, sequence_parallel=sp
    )
    load_hf_into_model([model], hf_dir)
    model.eval()  # no dropout anyway; eval lets the MoE layer run TP without SP
    if cp > 1:
        part = get_batch_on_this_cp_rank({"tokens": ids, "weight": weight, "ref": ref_logits})
        ids, weight, ref_logits = part["tokens"], part["weight"], part["ref"]
    logits = model(ids, None, None)  # [b, s/cp, padded/tp]
    logits = tensor_parallel.gather_from_tensor_model_parallel_region(logits)[..., :VOCAB]
    (logits * weight).sum().backward()
    grads = _full_grads(
        model, ps.get_tensor_model_parallel_group(), ps.get_context_parallel_group(), sp
    )
    ps.destroy_model_parallel()
    return logits.detach(), grads, ref_logits


def _rank_fn(hf_dir, ids, weight, hf_logits):
    ref_logits, ref_grads, _ = _run(hf_dir, ids, weight, 1, 1, False)
    errors = {"tp1 vs transformers": (ref_logits - hf_logits).abs().max().item()}
    for label, tp, cp, sp in (("tp2", 2, 1, False), ("tp2+sp", 2, 1, True), ("cp2", 1, 2, False)):
        logits, grads, want = _run(hf_dir, ids, weight, tp, cp, sp, ref_logits)
        errors[f"{label} logits"] = (logits - want).abs().max().item()
        assert grads.keys() == ref_grads.keys()
        names = list(ref_grads)
        if tp > 1 and not sp:  # MoE trains under TP only with SP (as Megatron): the routed
            names = [n for n in names if ".mlp.experts." not in n]  # experts see tokens twice
        err = {n: _rel_err(grads[n], ref_grads[n]) for n in names}
        worst = max(err, key=err.get)
        errors[f"{label} grads ({worst}, relative)"] = err[worst]
    return errors


def test_mla_deepseek_v3_tp2_sp_and_cp2_match_tp1(tmp_path):
    pytest.importorskip("transformers")
    from tests.convert.test_deepseek_convert import make_deepseek_model

    hf_dir = str(tmp_path / "hf")
    hf = make_deepseek_model("deepseek_v3", hf_dir, seed=2)
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, VOCAB, (B, S), generator=gen)
    weight = torch.randn(B, S, VOCAB, generator=gen)
    with torch.no_grad():
        hf_logits = hf(input_ids=ids).logits
    per_rank = run_distributed(_rank_fn, 2, args=(hf_dir, ids, weight, hf_logits), timeout=240)
    for errors in per_rank:
        print(errors)
        for what, err in errors.items():
            assert err <= 1e-5, f"{what}: max abs difference {err}"
