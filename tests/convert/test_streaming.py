"""Streaming import: each rank reads only the bytes of its own pieces, one piece at a time.

A tiny Llama (hidden 64, 4 layers, GQA) saved by transformers in several safetensors shards is
loaded by two gloo ranks at TP2 and then at PP2 with `load_hf_into_model`, counting what the
reader copies from the files (`bytes_read`) and the largest amount of read buffers alive at once
(`peak_live_bytes`). Each rank reads no more than its model holds (its TP slices / its stages;
replicated norms read by both TP ranks; a rank holding only vocabulary padding reads none of
the embedding), the two ranks together read at least the whole
checkpoint once, and the buffers alive at any time stay under the largest HF tensor: memory does
not grow with the checkpoint. The PP 2 model exported with `save_hf_weights` (streamed from both
stages, in shards) holds bitwise the source tensors. (The values loaded this way are checked
against transformers' logits in test_bridge.py and test_hf_parity.py.)
"""

import os

import pytest
import torch

from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank
transformers = pytest.importorskip("transformers")


def _rank_fn(hf_dir, out_dir):
    from gigatron.convert import load_hf_into_model, read_hf_config, spec_from_hf_config
    from gigatron.convert.bridge import AutoBridge
    from gigatron.convert.hf_io import HFReader
    from gigatron.core import parallel_state as ps

    out = {}
    for tp, pp in ((2, 1), (1, 2)):
        ps.initialize_model_parallel(tp, pp)
        spec = spec_from_hf_config(read_hf_config(hf_dir), tensor_model_parallel_size=tp)
        model = spec.build_model(
            pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
            pipeline_dtype=torch.float32,
        )  # fmt: skip
        reader = HFReader(hf_dir)
        load_hf_into_model([model], hf_dir, reader=reader)
        held = sum(p.numel() * p.element_size() for p in model.parameters())
        out[(tp, pp)] = dict(
            read=reader.bytes_read, peak=reader.peak_live_bytes, held=held, live=reader.live_bytes
        )
        if pp == 2:  # export streamed from the two stages (tensors held by one rank each)
            AutoBridge.from_hf_pretrained(hf_dir).save_hf_weights(
                [model], out_dir, False, max_shard_bytes=100_000
            )
        ps.destroy_model_parallel()
    return out


def test_each_rank_reads_only_its_pieces_with_bounded_buffers(tmp_path):
    from gigatron.convert.hf_io import HFReader

    hf_dir = str(tmp_path / "hf")
    cfg_kw = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4)
    config = transformers.LlamaConfig(
        vocab_size=100, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, tie_word_embeddings=False, **cfg_kw,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(hf_dir, max_shard_size="100KB")
    files = [n for n in os.listdir(hf_dir) if n.endswith(".safetensors")]
    assert len(files) >= 4  # several shards
    reader = HFReader(hf_dir)
    sizes = {k: reader.read(k).numel() * 4 for k in reader.keys()}
    total, largest = sum(sizes.values()), max(sizes.values())

    out_dir = str(tmp_path / "out")
    per_rank = run_distributed(_rank_fn, 2, args=(hf_dir, out_dir), timeout=240)
    for layout in ((2, 1), (1, 2)):
        got = [r[layout] for r in per_rank]
        for rank, g in enumerate(got):
            assert 0 < g["read"] <= g["held"], (layout, rank, g["read"], g["held"])
            assert g["peak"] <= largest, (layout, rank, g["peak"], largest)
            assert g["live"] == 0  # no read buffer outlives the load
        assert sum(g["read"] for g in got) >= total
        assert max(g["read"] for g in got) < 0.7 * total
    exported = HFReader(out_dir)
    assert sorted(exported.keys()) == sorted(reader.keys())
    for name in reader.keys():
        assert torch.equal(exported.get(name), reader.get(name)), name
