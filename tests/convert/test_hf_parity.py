"""HF -> gigatron at TP2 x PP2 (4 gloo ranks) gives transformers' logits, and back is bitwise.

Per family: a tiny random-weight model saved by transformers is converted with
`convert_hf_to_gigatron`; four ranks build a TP2 x PP2 GPTModel, load the converted checkpoint
through `gigatron.training.checkpointing.load_checkpoint` and run the pipeline schedule
(forward_only, collect_non_loss_data) to get logits, gathered over TP on the last stage. A second
model filled by `load_hf_into_model` straight from the HF files must give the same logits. The
reference logits come from transformers in this process (fp32, <= 1e-5). The checkpoint exported
with `convert_gigatron_to_hf` holds bitwise the original tensors (names, dtypes, shapes).
MoE families are also converted for, and loaded at, TP1 x EP2 x PP2 (global expert keys).
"""

import argparse

import pytest
import torch

from gigatron.testing import run_distributed
from tests.convert.test_hf_fixtures import (
    ADAPTER_FAMILIES,
    FAMILIES,
    MOE_FAMILIES,
    VOCAB,
    make_hf_model,
)

pytestmark = pytest.mark.multirank


transformers = pytest.importorskip("transformers")
B, S = 2, 16


def _tp_gather_last_dim(t):
    import torch.distributed as dist

    from gigatron.core import parallel_state as ps

    parts = [torch.empty_like(t) for _ in range(ps.get_tensor_model_parallel_world_size())]
    dist.all_gather(parts, t.contiguous(), group=ps.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=-1)


def _pipeline_logits(model, ids):
    from gigatron.core.pipeline_parallel import get_forward_backward_func

    def forward_step(data_iterator, m):
        tokens = next(data_iterator)
        return m(tokens, None, None), lambda out, non_loss_data=False: out

    out = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter([ids]), model=model,
        num_microbatches=1, seq_length=S, micro_batch_size=B, forward_only=True,
        collect_non_loss_data=True,
    )  # fmt: skip
    return out


def _rank_fn(hf_dir, ckpt_root, ids, tp=2, pp=2, ep=1, sources=("checkpoint", "hf")):
    from gigatron.convert import load_hf_into_model, read_hf_config, spec_from_hf_config
    from gigatron.core import parallel_state as ps
    from gigatron.core import tensor_parallel
    from gigatron.training.checkpointing import load_checkpoint

    ps.initialize_model_parallel(tp, pp, expert_model_parallel_size=ep)
    tensor_parallel.model_parallel_cuda_manual_seed(7)
    spec = spec_from_hf_config(read_hf_config(hf_dir), tensor_model_parallel_size=tp)
    first, last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
    results = []
    for source in sources:
        model = spec.build_model(
            pre_process=first, post_process=last, tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp, expert_model_parallel_size=ep,
            pipeline_dtype=torch.float32,
        ).eval()  # fmt: skip
        if source == "checkpoint":
            load_checkpoint([model], None, None, args=argparse.Namespace(load=ckpt_root))
        else:
            load_hf_into_model([model], hf_dir)
        with torch.no_grad():
            out = _pipeline_logits(model, ids)
        if last:
            results.append(_tp_gather_last_dim(out[0])[..., :VOCAB])
    return results if last else None


# GPT-OSS (expert biases: expert_tensor_parallel_size 1) runs EP2 x PP2 only (CI time).
@pytest.mark.parametrize("family", [f for f in FAMILIES + ADAPTER_FAMILIES if f != "gpt_oss"])
def test_convert_tp2_pp2_logits_and_bitwise_export(family, tmp_path):
    from gigatron.convert import convert_gigatron_to_hf, convert_hf_to_gigatron
    from gigatron.convert.hf_io import HFReader

    hf_dir, ckpt, back = str(tmp_path / "hf"), str(tmp_path / "gt"), str(tmp_path / "back")
    hf = make_hf_model(family, hf_dir)
    # Llama is converted with TP1 vocab padding (128 rows) and loaded at TP2 (256 rows): the
    # padded vocabulary is reshaped on load (allow_shape_mismatch); the others match TP2.
    target_tp = 1 if family == "llama" else 2
    convert_hf_to_gigatron(
        hf_dir, ckpt, tensor_model_parallel_size=target_tp, pipeline_model_parallel_size=2
    )
    ids = torch.randint(0, VOCAB, (B, S), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
    per_rank = run_distributed(_rank_fn, 4, args=(hf_dir, ckpt, ids), timeout=240)
    got = [r for r in per_rank if r is not None]
    assert len(got) == 2  # the two TP ranks of the last stage
    for from_ckpt, from_hf in got:
        assert from_ckpt.shape == ref.shape == (B, S, VOCAB)
        err = (from_ckpt - ref).abs().max().item()
        print(f"{family}: max |logits - transformers| = {err:.2e}")
        assert err <= 1e-5, f"{family}: max |logits - transformers| = {err}"
        torch.testing.assert_close(from_hf, from_ckpt, rtol=0, atol=0)

    convert_gigatron_to_hf(ckpt, back)
    orig, exported = HFReader(hf_dir), HFReader(back)
    assert sorted(orig.keys()) == sorted(exported.keys())
    for name in orig.keys():
        a, b = orig.get(name), exported.get(name)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), name
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
    reloaded = type(hf).from_pretrained(back).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, ref)


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_moe_expert_parallel_from_hf_and_converted_checkpoint(family, tmp_path):
    """TP1 x EP2 x PP2: load_hf_into_model gives each EP rank its global experts, and so does
    load_checkpoint from a checkpoint converted with target EP2 (global expert keys)."""
    from gigatron.convert import convert_hf_to_gigatron

    hf_dir, ckpt = str(tmp_path / "hf"), str(tmp_path / "gt")
    hf = make_hf_model(family, hf_dir, seed=1)
    convert_hf_to_gigatron(
        hf_dir, ckpt, pipeline_model_parallel_size=2, expert_model_parallel_size=2
    )
    ids = torch.randint(0, VOCAB, (B, S), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
    per_rank = run_distributed(_rank_fn, 4, args=(hf_dir, ckpt, ids, 1, 2, 2), timeout=240)
    got = [r for r in per_rank if r is not None]
    assert len(got) == 2  # the two EP (= DP) ranks of the last stage
    for from_ckpt, from_hf in got:
        err = (from_ckpt - ref).abs().max().item()
        print(f"{family} EP2: max |logits - transformers| = {err:.2e}")
        assert err <= 1e-5, err
        torch.testing.assert_close(from_hf, from_ckpt, rtol=0, atol=0)
