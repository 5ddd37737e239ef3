"""SFTDataset / SFTTokenizer (Megatron's `--sft` data): the chat template's answer tokens carry
the loss and nothing else does; a row of packed conversations gives every conversation the
per-token losses it has alone (PackedSeqParams, positions restarting per conversation)."""

import numpy
import pytest
import torch

from gigatron.core.packed_seq_params import PackedSeqParams
from gigatron.core.tokenizers.text.libraries.sft_tokenizer import IGNORE_INDEX, SFTTokenizer
from gigatron.training.datasets.sft_dataset import (
    SFTLowLevelDataset,
    pack_conversations,
    split_conversations,
)
from tests._one_rank import one_rank_fixtures
from tests.training.datasets._chat_data import conversation, make_chat_tokenizer, write_jsonl

pytest.importorskip("transformers")
gloo_world, single_rank = one_rank_fixtures()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("chat_tok"))
    make_chat_tokenizer(path)
    return SFTTokenizer(path, "default")


def test_only_assistant_answers_carry_loss(tokenizer):
    rng = numpy.random.default_rng(0)
    conv = conversation(rng, turns=2)
    ids, target = tokenizer.tokenize_conversation(conv, return_target=True,
                                                  add_generation_prompt=False)  # fmt: skip
    names = tokenizer._tokenizer.convert_ids_to_tokens(ids.tolist())
    # the answers' words and their end-of-turn token, nothing of the system / user turns
    kept = [n for n, t in zip(names, target.tolist(), strict=True) if t != IGNORE_INDEX]
    answers = [w for m in conv if m["role"] == "assistant" for w in m["content"].split()]
    assert kept == [w for a in _answers(conv) for w in a] and len(kept) == len(answers) + 2
    assert (target[target != IGNORE_INDEX] == ids[target != IGNORE_INDEX]).all()

    row = pack_conversations([conv], tokenizer, 40)
    # the token each position predicts (the last one predicts padding)
    next_names = tokenizer._tokenizer.convert_ids_to_tokens(row["tokens"][1:].tolist())
    mask = row["loss_mask"][:-1].tolist()
    assert row["loss_mask"][-1] == 0
    masked = {n for n, m in zip(next_names, mask, strict=True) if m == 0}
    learned = [n for n, m in zip(next_names, mask, strict=True) if m == 1]
    assert learned == kept  # labels are the tokens shifted by one
    assert {"<|system|>", "<|user|>", "<|assistant|>", "<pad>"} <= masked
    assert not set(learned) & {"<|system|>", "<|user|>", "<|assistant|>", "<pad>", "<s>"}


def _answers(conv):
    return [m["content"].split() + ["<|end|>"] for m in conv if m["role"] == "assistant"]


def test_jsonl_lines_split_at_system_messages_into_one_packed_row(tokenizer, tmp_path):
    rng = numpy.random.default_rng(1)
    a, b = conversation(rng), conversation(rng, turns=2)
    path = write_jsonl(str(tmp_path / "d.jsonl"), [a + b, a])
    low = SFTLowLevelDataset(path)
    assert len(low) == 2 and split_conversations(low[0]) == [a, b]
    row = pack_conversations(split_conversations(low[0]), tokenizer, 64)
    n_a = len(tokenizer.tokenize_conversation(a, False, False))
    n_b = len(tokenizer.tokenize_conversation(b, False, False))
    assert row["cu_seqlens"][:3].tolist() == [0, n_a, 64] and row["cu_seqlens"][-1] == 64
    assert row["position_ids"][n_a] == 0 and row["position_ids"][n_a + n_b - 1] == n_b - 1
    assert row["tokens"].shape == row["labels"].shape == row["loss_mask"].shape == (64,)
    short = pack_conversations([a, b], tokenizer, n_a + 3)  # cut on the right
    assert short["cu_seqlens"][:3].tolist() == [0, n_a, n_a + 3]
    (tmp_path / "bad.jsonl").write_text('{"text": "no messages"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: .*\"messages\" list"):
        SFTLowLevelDataset(str(tmp_path / "bad.jsonl"))


def test_packed_conversations_lose_what_each_loses_alone(tokenizer):
    from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from gigatron.core.models.gpt.gpt_model import GPTModel
    from gigatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4,
                            hidden_dropout=0.0, attention_dropout=0.0)  # fmt: skip
    model = GPTModel(cfg, get_gpt_layer_local_spec(), vocab_size=64, max_sequence_length=64,
                     position_embedding_type="rope").eval()  # fmt: skip
    rng = numpy.random.default_rng(2)
    convs = [conversation(rng, turns=t) for t in (1, 2, 1)]

    def masked_losses(row):
        cu = row["cu_seqlens"]
        cu = cu[: int((cu == cu[-1]).nonzero()[0]) + 1]
        packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                 max_seqlen_q=int(row["max_seqlen"]),
                                 max_seqlen_kv=int(row["max_seqlen"]))  # fmt: skip
        with torch.no_grad():
            loss = model(row["tokens"][None], row["position_ids"][None], None,
                         labels=row["labels"][None], packed_seq_params=packed)[0]  # fmt: skip
        return loss[row["loss_mask"] == 1]

    packed = masked_losses(pack_conversations(convs, tokenizer, 64))
    alone = torch.cat([masked_losses(pack_conversations([c], tokenizer, 32)) for c in convs])
    assert packed.numel() == alone.numel() > 10
    torch.testing.assert_close(packed, alone, atol=1e-6, rtol=0)
