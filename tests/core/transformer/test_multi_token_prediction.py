"""Multi-token prediction on one process: the gradients equal those of the objective written
from DeepSeek-V3's definition (main mean loss + factor / D x the depths' mean losses, each depth
fed the previous depth's hidden state and the embedding of the token k ahead), the logged depth
losses, the one-token roll, detached heads, the repeated layer, Megatron's checkpoint keys and
the one-line errors."""

import pytest
import torch
import torch.nn.functional as F

from gigatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_mtp_block_spec,
)
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.packed_seq_params import PackedSeqParams
from gigatron.core.transformer.multi_token_prediction import (
    MTPLossAutoScaler,
    MTPLossLoggingHelper,
    roll_tensor,
)
from gigatron.core.transformer.transformer_config import TransformerConfig
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures()

V, S, B = 48, 12, 2


def _model(depths=2, factor=0.3, **cfg):
    config = TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
        mtp_num_layers=depths, mtp_loss_scaling_factor=factor, **cfg,
    )  # fmt: skip
    spec = get_gpt_layer_local_spec()
    torch.manual_seed(0)
    return GPTModel(
        config, spec, V, S, position_embedding_type="rope",
        mtp_block_spec=get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False),
    )  # fmt: skip


def _data():
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, V, (B, S + 1), generator=gen)
    mask = (torch.rand(B, S, generator=gen) > 0.2).float()
    return tokens[:, :-1], tokens[:, 1:], mask, torch.arange(S).expand(B, S)


def _shift(x, k):
    """x [b, s] moved k tokens left, zeros after the end."""
    out = torch.zeros_like(x)
    out[:, : S - k] = x[:, k:]
    return out


def _reference_objective(model, ids, labels, mask, pos, depths, factor):
    """main mean CE + factor / D * sum_k mean CE of depth k, from the definition."""
    rope = model.rotary_pos_emb(S)
    h = model.decoder(hidden_states=model.embedding(ids, pos), attention_mask=None,
                      rotary_pos_emb=rope)  # fmt: skip

    def mean_ce(hidden, target, m):
        logits = model.output_layer(hidden)[0].transpose(0, 1)  # [b, s, V]
        ce = F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), reduction="none")
        return (ce * m.reshape(-1)).sum() / m.sum()

    total = mean_ce(h, labels, mask)
    depth_losses = []
    for k in range(1, depths + 1):
        layer = model.mtp.layers[k - 1]
        emb = model.embedding(_shift(ids, k), _shift(pos, k))
        x = torch.cat([layer.enorm(emb), layer.hnorm(h)], dim=-1) @ layer.eh_proj.weight.t()
        h = layer.final_layernorm(layer.mtp_model_layer(x, None, rotary_pos_emb=rope)[0])
        depth_losses.append(mean_ce(h, _shift(labels, k), _shift(mask, k)))
    return total + factor / depths * sum(depth_losses), depth_losses


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_mtp_gradients_equal_the_objective_written_from_the_definition():
    ids, labels, mask, pos = _data()
    model = _model()
    MTPLossAutoScaler.set_loss_scale(torch.tensor(1.0))
    MTPLossLoggingHelper.clean_metrics_in_tracker()
    per_token = model(ids, pos, None, labels=labels, loss_mask=mask)
    ((per_token * mask).sum() / mask.sum()).backward()
    got = _grads(model)
    logged = MTPLossLoggingHelper.tracker["loss_values"].clone()
    model.zero_grad()
    objective, depth_losses = _reference_objective(model, ids, labels, mask, pos, 2, 0.3)
    objective.backward()
    want = _grads(model)
    assert set(got) == set(want) and any(n.startswith("mtp.layers.1.") for n in got)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)
    torch.testing.assert_close(logged, torch.stack(depth_losses).detach(), rtol=1e-6, atol=1e-6)


def test_mtp_loss_reaches_the_word_embedding_and_the_decoder():
    ids, labels, mask, pos = _data()
    grads = {}
    for factor in (0.0, 1.0):
        model = _model(factor=factor)
        MTPLossAutoScaler.set_loss_scale(torch.tensor(1.0))
        model(ids, pos, None, labels=labels, loss_mask=mask).mul(mask).sum().backward()
        grads[factor] = _grads(model)
    for name in ("embedding.word_embeddings.weight", "decoder.layers.0.mlp.linear_fc1.weight"):
        assert not torch.allclose(grads[0.0][name], grads[1.0][name]), name


def test_detached_heads_leave_the_main_model_grads_alone():
    ids, labels, mask, pos = _data()
    grads = {}
    for detach, factor in ((True, 1.0), (True, 0.0)):
        model = _model(factor=factor, mtp_detach_heads=detach)
        MTPLossAutoScaler.set_loss_scale(torch.tensor(1.0))
        model(ids, pos, None, labels=labels, loss_mask=mask).mul(mask).sum().backward()
        grads[factor] = _grads(model)
        assert all(p.grad_norm_group == "mtp" for p in model.mtp.parameters())
    for name, g in grads[1.0].items():
        if not name.startswith("mtp."):
            torch.testing.assert_close(g, grads[0.0][name], rtol=0, atol=0, msg=name)
    assert not torch.allclose(
        grads[1.0]["mtp.layers.0.eh_proj.weight"], grads[0.0]["mtp.layers.0.eh_proj.weight"]
    )


def test_repeated_layer_builds_one_layer_used_at_every_depth():
    model = _model(depths=3, mtp_use_repeated_layer=True)
    assert len(model.mtp.layers) == 1
    ids, labels, mask, pos = _data()
    MTPLossLoggingHelper.clean_metrics_in_tracker()
    model(ids, pos, None, labels=labels, loss_mask=mask).sum().backward()
    assert (MTPLossLoggingHelper.tracker["loss_values"] > 0).all()


def test_roll_tensor_shifts_one_token_left_and_zeroes_the_end():
    x = torch.arange(1, 9).view(2, 4)
    rolled, total = roll_tensor(x)
    assert rolled.tolist() == [[2, 3, 4, 0], [6, 7, 8, 0]]
    assert total.item() == rolled.sum().item()


def test_roll_tensor_keeps_packed_documents_apart():
    x = torch.arange(1, 8).view(1, 7)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu)
    rolled, _ = roll_tensor(x, packed_seq_params=params)
    assert rolled.tolist() == [[2, 3, 0, 5, 6, 7, 0]]


def test_sharded_state_dict_uses_megatrons_mtp_keys():
    keys = {v.key for v in _model(depths=2).sharded_state_dict().values() if hasattr(v, "key")}
    for k in range(2):
        for suffix in (
            "enorm.weight", "hnorm.weight", "eh_proj.weight", "final_layernorm.weight",
            "transformer_layer.self_attention.linear_qkv.weight",
            "transformer_layer.mlp.linear_fc1.weight",
        ):  # fmt: skip
            assert f"mtp.layers.{k}.{suffix}" in keys
    assert not any("mtp_model_layer" in k for k in keys)


def test_mtp_errors_name_the_setting():
    with pytest.raises(ValueError, match=r"mtp_num_layers \(-1\)"):
        TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, mtp_num_layers=-1)
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, mtp_num_layers=1)
    with pytest.raises(ValueError, match="mtp_block_spec"):
        GPTModel(config, get_gpt_layer_local_spec(), V, S)
    with pytest.raises(ValueError, match=r"shifts \(1\)"):
        roll_tensor(torch.zeros(2, 3), shifts=1)
