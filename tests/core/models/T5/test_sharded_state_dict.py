"""T5Model's `sharded_state_dict()` is megatron-core's (stacked `encoder.layers.<name>` [L_enc, ...]
and `decoder.layers.<name>` [L_dec, ...], per-layer `_extra_state` objects, megatron-core's alias
names, keyed by the module's own state-dict keys); saved and loaded with Megatron's snippet
(`save(model.sharded_state_dict(), d)`, `model.load_state_dict(load(model.sharded_state_dict(),
d))`).

- TP = 2 save -> TP = 1 (DP = 2) load: weights bitwise equal to the full set the TP = 2 model
  was loaded from, logits equal to the TP = 2 model's; every entry (key, shapes, offsets,
  replica id) equals megatron-core 0.16.1's own T5Model's (local spec, built on CPU at TP = 2),
  for tied learned-absolute and untied relative-position models.
- PP = 2 (encoder stage, decoder stage) save -> PP = 1 load: same weights, logits equal to the
  two-stage forward; the stages' keys together equal the PP = 1 model's.
- A checkpoint in the older gigatron layout (per-layer encoder keys; a fixture written by the
  code of that time, tests/fixtures/legacy_ckpt) loads through
  `sharded_state_dict(metadata={"legacy_layout": True})` and gives the logits it was saved with.
- megatron-core 0.16.1's T5Model loads a gigatron T5 checkpoint and gigatron's loads
  megatron-core's (TP = 1, its own dist_checkpointing save/load): logits equal.
"""

import dataclasses

import pytest
import torch

from gigatron.testing import run_distributed
from tests._paths import FIXTURES, REPO, with_oracle
from tests.core.models._sharded_structure import describe, differences
from tests.core.models.bert.test_sharded_state_dict import _layout  # key -> global shape

pytestmark = pytest.mark.multirank


V, MAX_SEQ, ENC_L, DEC_L, B, SE, SD = 64, 16, 4, 2, 2, 8, 6
KW = dict(num_layers=DEC_L, hidden_size=32, num_attention_heads=4, hidden_dropout=0.0)
KW["attention_dropout"] = 0.0


def _model_kwargs(tied: bool, pos: str) -> dict:
    return dict(
        vocab_size=V,
        max_sequence_length=MAX_SEQ,
        share_embeddings_and_output_weights=tied,
        position_embedding_type=pos,
    )


def _gigatron_t5(tp=1, pp=1, stage=None, tied=True, pos="learned_absolute"):
    """T5 at TP = tp; with pp = 2, stage 0 = the encoder stage, stage 1 = the decoder stage."""
    from gigatron.core.models.T5 import T5Model
    from gigatron.core.models.T5.t5_spec import (
        get_t5_decoder_with_local_block_spec,
        get_t5_encoder_with_local_block_spec,
    )
    from gigatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(
        **KW,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.float32 if pp > 1 else None,
        use_cpu_initialization=True,
    )
    split = {} if stage is None else dict(add_encoder=stage == 0, add_decoder=stage == 1)
    return T5Model(
        cfg,
        dataclasses.replace(cfg, num_layers=ENC_L),
        get_t5_encoder_with_local_block_spec(ENC_L),
        get_t5_decoder_with_local_block_spec(DEC_L),
        post_process=stage != 0,
        **_model_kwargs(tied, pos),
        **split,
    ).eval()


def _megatron_structure(tp, tied, pos):
    """`describe` of megatron-core's T5Model (local layer specs) on CPU: `current_device`
    stubbed to "cpu" (its only CUDA call at construction)."""
    from megatron.core import parallel_state as mps
    from megatron.core.models.T5.t5_model import T5Model
    from megatron.core.models.T5.t5_spec import (
        decoder_model_with_local_spec,
        encoder_model_with_local_spec,
    )
    from megatron.core.transformer.transformer_config import TransformerConfig

    if not torch.cuda.is_available():
        torch.cuda.current_device = lambda: "cpu"
    mps.initialize_model_parallel(tensor_model_parallel_size=tp)
    try:
        cfg = TransformerConfig(**KW, tensor_model_parallel_size=tp, use_cpu_initialization=True)
        model = T5Model(
            cfg,
            dataclasses.replace(cfg, num_layers=ENC_L),
            encoder_model_with_local_spec(),
            decoder_model_with_local_spec(),
            **_model_kwargs(tied, pos),
        )
        return describe(model.sharded_state_dict())
    finally:
        mps.destroy_model_parallel()


def _init(tp=1, pp=1):
    from gigatron.core import parallel_state, tensor_parallel
    from gigatron.training.pretrain_t5 import t5_position_embedding_ranks

    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tp, pp, get_position_embedding_ranks=t5_position_embedding_ranks
    )
    tensor_parallel.model_parallel_cuda_manual_seed(1234)


def _inputs():
    g = torch.Generator().manual_seed(7)
    enc = torch.randint(0, V, (B, SE), generator=g)
    dec = torch.randint(0, V, (B, SD), generator=g)
    causal = torch.ones(SD, SD, dtype=torch.bool).triu(1).expand(B, 1, SD, SD)
    no_mask = lambda sq, sk: torch.zeros(B, 1, sq, sk, dtype=torch.bool)
    return enc, dec, no_mask(SE, SE), causal, no_mask(SD, SE)


def _full_weights(**kw) -> dict:
    _init()
    torch.manual_seed(0)
    return {n: p.detach().clone() for n, p in _gigatron_t5(**kw).named_parameters()}


def _load(model, ckpt_dir) -> None:
    """Megatron's snippet: load_state_dict(load(sharded_state_dict(), d))."""
    from gigatron.core import dist_checkpointing

    model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(), ckpt_dir))


def _mismatched(model, full) -> list:
    return [n for n, p in model.named_parameters() if not torch.equal(p, full[n])]


def _gather_vocab(logits):
    """[b, sd, V/tp] -> [b, sd, V] over the TP group."""
    import torch.distributed as dist

    from gigatron.core import parallel_state

    group = parallel_state.get_tensor_model_parallel_group()
    parts = [torch.empty_like(logits) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, logits.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


def _tp_roundtrip(ckpt_dir, tied, pos):
    from gigatron.core import dist_checkpointing
    from gigatron.core.models.common.tp_state_dict import load_full_state_dict

    kw = dict(tied=tied, pos=pos)
    full = _full_weights(**kw)
    _init(tp=2)
    saved = _gigatron_t5(tp=2, **kw)
    load_full_state_dict(saved, full)
    sharded = saved.sharded_state_dict()
    layout = _layout(sharded)
    own_keys = set(sharded) == set(saved.state_dict())
    dist_checkpointing.save(sharded, ckpt_dir)
    with torch.no_grad():
        ref_logits = _gather_vocab(saved(*_inputs()))
    structure = differences(describe(sharded), _megatron_structure(2, tied, pos))

    _init(tp=1)
    torch.manual_seed(1)
    fresh = _gigatron_t5(tp=1, **kw)
    before = _mismatched(fresh, full)
    _load(fresh, ckpt_dir)
    with torch.no_grad():
        err = (fresh(*_inputs()) - ref_logits).abs().max().item()
    return layout, (structure, own_keys), _mismatched(fresh, full), len(before), err


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "tied, pos", [(True, "learned_absolute"), (False, "relative")], ids=["tied", "untied-rel"]
)
def test_t5_megatron_layout_tp2_to_tp1(tmp_path, tied, pos):
    results = run_distributed(_tp_roundtrip, 2, args=(str(tmp_path), tied, pos), timeout=180)
    for layout, (structure, own_keys), mismatched, n_before, err in results:
        assert mismatched == [] and n_before > 0
        assert layout["encoder.layers.self_attention.linear_qkv.weight"] == (ENC_L, 96, 32)
        assert layout["encoder.layers.mlp.linear_fc1.layer_norm_weight"] == (ENC_L, 32)
        assert layout["decoder.layers.cross_attention.linear_kv.weight"] == (DEC_L, 64, 32)
        assert layout["encoder.layers.mlp.linear_fc2._extra_state"] == ("object", (ENC_L,))
        assert not any(k.startswith(("encoder.layers.0.", "decoder.layers.0.")) for k in layout)
        assert structure == [], "\n".join(structure)
        assert own_keys
        assert err < 1e-5, err


_SHARED = ("embedding.", "position_embeddings.")


def _pp_roundtrip(ckpt_dir):
    import torch.distributed as dist

    from gigatron.core import dist_checkpointing, parallel_state

    full = _full_weights()
    with torch.no_grad():
        pp1_layout = _layout(_gigatron_t5().sharded_state_dict())

    _init(pp=2)
    stage = parallel_state.get_pipeline_model_parallel_rank()
    saved = _gigatron_t5(pp=2, stage=stage)
    with torch.no_grad():
        for name, p in saved.named_parameters():
            p.copy_(full[name])
    sharded = saved.sharded_state_dict()
    dist_checkpointing.save(sharded, ckpt_dir)
    # The two-stage forward: the encoder stage's output goes to the decoder stage.
    enc_out = torch.empty(SE, B, KW["hidden_size"])
    with torch.no_grad():
        if stage == 0:
            dist.send(saved(*_inputs()).contiguous(), dst=1)
            pp_logits = torch.empty(B, SD, V)
        else:
            dist.recv(enc_out, src=0)
            saved.set_input_tensor([enc_out])
            pp_logits = saved(*_inputs())
    dist.broadcast(pp_logits, src=1)

    _init()
    torch.manual_seed(1)
    fresh = _gigatron_t5()
    _load(fresh, ckpt_dir)
    with torch.no_grad():
        err = (fresh(*_inputs()) - pp_logits).abs().max().item()
    copies = {sh.key: sh.replica_id for sh in sharded.values() if sh.key.startswith(_SHARED)}
    return _layout(sharded), pp1_layout, _mismatched(fresh, full), err, copies


@pytest.mark.timeout(180)
def test_t5_pp2_encoder_decoder_stages_to_pp1(tmp_path):
    stages = run_distributed(_pp_roundtrip, 2, args=(str(tmp_path),), timeout=180)
    (enc_layout, pp1, mism0, err0, enc_copies), (dec_layout, _, mism1, err1, dec_copies) = stages
    assert mism0 == mism1 == [] and err0 == err1 and err0 < 1e-5, (err0, err1)
    assert {**enc_layout, **dec_layout} == pp1
    assert not any(k.startswith("decoder.") for k in enc_layout)
    assert not any(k.startswith("encoder.") for k in dec_layout)
    # Both stages hold the word and position embeddings: the decoder stage's are non-main.
    assert set(enc_copies) == set(dec_copies) and len(enc_copies) == 3
    assert all(r[0] == 0 for r in enc_copies.values()), enc_copies
    assert all(r[0] == 1 for r in dec_copies.values()), dec_copies


def _legacy_load(fixture_dir):
    """The fixture in the older layout: the default request fails on it, the legacy one loads
    it (the copy under each second name is not in it: load_state_dict(strict=False))."""
    from gigatron.core import dist_checkpointing, parallel_state
    from tests.fixtures.legacy_ckpt.make_legacy_ckpt import build_t5, t5_inputs

    parallel_state.initialize_model_parallel()
    torch.manual_seed(1)
    model = build_t5()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    new_layout_failed = False
    try:
        dist_checkpointing.load(model.sharded_state_dict(), fixture_dir)
    except Exception:
        new_layout_failed = True
    request = model.sharded_state_dict(metadata={"legacy_layout": True})
    result = model.load_state_dict(dist_checkpointing.load(request, fixture_dir), strict=False)
    with torch.no_grad():
        logits = model(*t5_inputs())
    return _layout(request), new_layout_failed, sorted(result.missing_keys), logits


def test_t5_legacy_layout_loads():
    import os

    fixtures = os.path.join(FIXTURES, "legacy_ckpt")
    ((layout, new_layout_failed, missing, logits),) = run_distributed(
        _legacy_load, 1, args=(os.path.join(fixtures, "t5"),), timeout=120
    )
    assert layout["encoder.layers.0.self_attention.linear_qkv.weight"] == (48, 16)
    assert layout["decoder.layers.self_attention.linear_qkv.weight"] == (1, 48, 16)
    assert not any(k.startswith("encoder.layers.") and "_extra_state" in k for k in layout)
    assert new_layout_failed
    assert missing == ["output_layer.bias", "position_embeddings.weight"]  # (the aliases)
    expected = torch.load(os.path.join(fixtures, "t5_reference.pt"), weights_only=True)["logits"]
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-6)


def _interop_worker(tmp: str) -> None:
    """One plain process (megatron-core's writer starts worker processes, which the harness's
    daemonic ranks may not): gigatron T5 -> megatron-core T5 and back at TP = 1, printing the
    max logit differences as JSON. CUDA calls megatron-core makes on CPU torch are stubbed."""
    import json
    import tempfile

    import torch.distributed as dist
    from megatron.core import dist_checkpointing as mdc
    from megatron.core import parallel_state as mps
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    from megatron.core.models.T5.t5_model import T5Model
    from megatron.core.models.T5.t5_spec import (
        decoder_model_with_local_spec,
        encoder_model_with_local_spec,
    )
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.transformer_config import TransformerConfig

    from gigatron.core import dist_checkpointing as gdc

    init = f"file://{tempfile.mktemp(dir=tmp)}"
    dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
    if not torch.cuda.is_available():
        torch.cuda.current_device = lambda: "cpu"
        torch.cuda.synchronize = lambda *args, **kwargs: None
        mrandom._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
        mrandom._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
        mrandom.get_cuda_rng_tracker().states_["model-parallel-rng"] = torch.get_rng_state()
    filesystem_async._process_memory = lambda: 0  # its memory logging needs psutil
    mps.initialize_model_parallel(1)
    _init()

    def megatron_t5(seed):
        torch.manual_seed(seed)
        cfg = TransformerConfig(**KW, use_cpu_initialization=True)
        return T5Model(
            cfg,
            dataclasses.replace(cfg, num_layers=ENC_L),
            encoder_model_with_local_spec(),
            decoder_model_with_local_spec(),
            **_model_kwargs(True, "learned_absolute"),
        ).eval()

    def gigatron_t5(seed):
        torch.manual_seed(seed)
        return _gigatron_t5()

    errs, x = {}, _inputs()
    with torch.no_grad():
        g = gigatron_t5(1)
        gdc.save(g.sharded_state_dict(), f"{tmp}/gigatron")
        m_from_g = megatron_t5(2)
        before = (m_from_g(*x) - g(*x)).abs().max().item()
        m_from_g.load_state_dict(mdc.load(m_from_g.sharded_state_dict(), f"{tmp}/gigatron"))
        errs["megatron_from_gigatron"] = (m_from_g(*x) - g(*x)).abs().max().item()
        m = megatron_t5(3)
        mdc.save(m.sharded_state_dict(), f"{tmp}/megatron")
        g_from_m = gigatron_t5(4)
        _load(g_from_m, f"{tmp}/megatron")
        errs["gigatron_from_megatron"] = (g_from_m(*x) - m(*x)).abs().max().item()
    errs["before_load"] = before
    print("RESULT " + json.dumps(errs))
    dist.destroy_process_group()


@pytest.mark.timeout(240)
def test_t5_checkpoint_interop_with_megatron_core(tmp_path):
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("megatron.core.models.T5")
    for d in ("gigatron", "megatron"):
        os.makedirs(tmp_path / d)
    root = str(REPO)
    code = (
        "import sys; from tests.core.models.T5.test_sharded_state_dict "
        "import _interop_worker as w; "
    )
    proc = subprocess.run(
        [sys.executable, "-c", code + "w(sys.argv[1])", str(tmp_path)],
        cwd=root,
        env=with_oracle(dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")),
        capture_output=True,
        text=True,
        timeout=220,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    errs = json.loads(lines[-1][len("RESULT ") :])
    assert errs["before_load"] > 1e-3  # the loaded side starts from other weights
    assert errs["megatron_from_gigatron"] < 1e-5 and errs["gigatron_from_megatron"] < 1e-5, errs
