"""GPTModel under context parallelism on gloo ranks: CP = 2 and 4 with each cp_comm_type, and
CP x TP = 2 x 2 (with and without SP), give the same logits, per-token loss and gradients (summed
over CP, as DDP's DP x CP reduction does) as the one-rank model from the same weights (fp32, 1e-5).

Models: Llama style (RoPE, GQA 8 heads / 4 groups, RMSNorm, SwiGLU) and GPT-2 style (learned
positions, tied embeddings, explicit causal mask, which causal CP attention ignores as TE does);
Gemma 2 / 3 style (_parity.GEMMA_CONFIG: a sliding-window layer with its own RoPE base, logit
soft-capping) under the all_gather and a2a modes, which the p2p ring refuses.
"""

import copy

import pytest
import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.core.models.common.tp_state_dict import shard_for_rank
from gigatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_fast_spec,
    get_gpt_layer_local_spec,
)
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.context_parallel import ContextParallelAttention
from gigatron.core.transformer.context_parallel._layout import zigzag_positions
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.core.utils import get_batch_on_this_cp_rank
from gigatron.testing import run_distributed
from tests.core.models.gpt import _parity as parity

pytestmark = pytest.mark.multirank


V, S, B = 64, 16, 2
STYLES = {
    "llama": dict(config=parity.LLAMA_CONFIG, model=parity.LLAMA_MODEL),
    "gpt2": dict(
        config=dict(num_layers=1, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64),
        model=dict(
            position_embedding_type="learned_absolute", share_embeddings_and_output_weights=True
        ),
    ),
    "gemma": dict(config=parity.GEMMA_CONFIG, model=parity.GEMMA_MODEL),
}


def _cp_spec(comm, spec_fn):
    """The spec with ContextParallelAttention and cp_comm_type set explicitly (spec params win
    over config.cp_comm_type); `comm=None` leaves the spec untouched: Attention swaps in
    ContextParallelAttention by itself."""
    spec = spec_fn()
    if comm is None:
        return spec
    spec = copy.deepcopy(spec)
    attn = spec.submodules.self_attention
    attn.submodules.core_attention = ContextParallelAttention
    attn.params = {**attn.params, "cp_comm_type": comm}
    return spec


def _build(style, tp=1, cp=1, comm=None, sp=False, spec_fn=get_gpt_layer_local_spec):
    cfg_comm = None
    if isinstance(comm, tuple):  # per-layer list through config.cp_comm_type
        cfg_comm, comm = list(comm), None
    cfg = TransformerConfig(
        **STYLES[style]["config"],
        cp_comm_type=cfg_comm,
        tensor_model_parallel_size=tp,
        sequence_parallel=sp,
        context_parallel_size=cp,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
    )
    spec = get_gpt_layer_local_spec() if cp == 1 else _cp_spec(comm, spec_fn)
    return GPTModel(cfg, spec, V, S, **STYLES[style]["model"])


def _causal_mask():
    return torch.ones(1, 1, S, S, dtype=torch.bool).triu(1)


def _inputs():
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, V, (B, S), generator=g)
    labels = torch.randint(0, V, (B, S), generator=g)
    weights = torch.rand(B, S, generator=g)
    return dict(tokens=ids, labels=labels, weights=weights, position_ids=torch.arange(S)[None])


def _run(model, batch, mask):
    with torch.no_grad():
        logits = model(batch["tokens"], batch["position_ids"], mask)
    loss = model(batch["tokens"], batch["position_ids"], mask, labels=batch["labels"])
    (loss * batch["weights"]).sum().backward()
    return logits, loss.detach()


def _reference(style):
    torch.manual_seed(0)
    model = _build(style)
    batch = _inputs()
    logits, loss = _run(model, batch, _causal_mask())
    full, grads = parity.weights_and_grads(model)
    return full, logits, loss, grads


def _check(style, tp, cp, comm, ref, sp=False, spec_fn=get_gpt_layer_local_spec):
    full, ref_logits, ref_loss, ref_grads = ref
    tp_rank, cp_rank = ps.get_tensor_model_parallel_rank(), ps.get_context_parallel_rank()
    model = _build(style, tp, cp, comm, sp, spec_fn)
    params = parity.load_shards(model, full, tp_rank, tp)
    batch = get_batch_on_this_cp_rank(_inputs())
    mask = get_batch_on_this_cp_rank({"attention_mask": _causal_mask()})["attention_mask"]
    logits, loss = _run(model, batch, mask)
    idx = zigzag_positions(cp, cp_rank, S // cp)
    expected_logits = ref_logits[:, idx].chunk(tp, dim=-1)[tp_rank]
    torch.testing.assert_close(logits, expected_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(loss, ref_loss[:, idx], rtol=0, atol=1e-5)
    errors = {
        "logits": (logits - expected_logits).abs().max().item(),
        "loss": (loss - ref_loss[:, idx]).abs().max().item(),
        "grads": 0.0,
    }
    for name, p in params.items():
        grad = p.grad.clone()
        dist.all_reduce(grad, group=ps.get_context_parallel_group())  # each CP rank: its tokens
        if sp and getattr(p, "sequence_parallel", False):  # finalize_model_grads' SP rule
            dist.all_reduce(grad, group=ps.get_tensor_model_parallel_group())
        expected = shard_for_rank(ref_grads[name], p, tp_rank, tp)
        torch.testing.assert_close(grad, expected, rtol=0, atol=1e-5, msg=f"{comm} {name}")
        errors["grads"] = max(errors["grads"], (grad - expected).abs().max().item())
    return errors


def _body(tp, cp, comms, styles, sps=(False,), spec_fn=get_gpt_layer_local_spec):
    refs = parity.references_then_layout(_reference, styles, tp, cp)
    return {
        (style, comm, sp): _check(style, tp, cp, comm, refs[style], sp, spec_fn)
        for style in styles
        for comm in comms
        for sp in sps
    }


ALL = ("p2p", "all_gather", "a2a")


@pytest.mark.parametrize(
    "cp, styles", [(2, ("llama", "gpt2")), (4, ("llama",))], ids=["cp2", "cp4"]
)
def test_gpt_context_parallel_matches_cp1(cp, styles):
    errors = run_distributed(_body, cp, args=(1, cp, ALL, styles), timeout=300)[0]
    for key, errs in errors.items():
        assert max(errs.values()) <= 1e-5, (key, errs)


def test_gpt_context_parallel_with_tensor_parallel():
    """CP x TP = 2 x 2, with and without sequence parallelism."""
    errors = run_distributed(_body, 4, args=(2, 2, ALL, ("llama",), (False, True)), timeout=300)[0]
    for key, errs in errors.items():
        assert max(errs.values()) <= 1e-5, (key, errs)


@pytest.mark.parametrize("spec_fn", [get_gpt_layer_local_spec, get_gpt_layer_fast_spec])
def test_gpt_context_parallel_unmodified_spec(spec_fn):
    """Megatron's usual specs as they are: CP attention and zigzag RoPE come by themselves."""
    comms = (None, ("a2a", "all_gather"))  # default p2p; config.cp_comm_type, one per layer
    errors = run_distributed(_body, 2, args=(1, 2, comms, ("llama",), (False,), spec_fn))[0]
    for key, errs in errors.items():
        assert max(errs.values()) <= 1e-5, (key, errs)


def test_gpt_context_parallel_gemma_window_and_softcap():
    """Gemma style at CP = 2 (all_gather, a2a, per-layer list) and CP x TP = 2 x 2 with SP."""
    comms = ("all_gather", "a2a", ("a2a", "all_gather"))
    errors = run_distributed(_body, 2, args=(1, 2, comms, ("gemma",)), timeout=300)[0]
    errors.update(
        run_distributed(
            _body, 4, args=(2, 2, ("all_gather", "a2a"), ("gemma",), (False, True)), timeout=300
        )[0]
    )
    for key, errs in errors.items():
        assert max(errs.values()) <= 1e-5, (key, errs)


def _p2p_refusal():
    ps.initialize_model_parallel(1, context_parallel_size=2)
    try:
        _build("gemma", cp=2, comm="p2p")
    except ValueError as e:
        return str(e)
    return None


def test_gpt_context_parallel_ring_refuses_window_and_softcap():
    message = run_distributed(_p2p_refusal, 2)[0]
    assert message is not None and "cp_comm_type 'all_gather' or 'a2a'" in message
