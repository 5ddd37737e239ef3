"""Megatron 0.20's inference API objects over gigatron's generate: InferenceConfig (batches of
max_requests give the same greedy tokens as one batch; max_sequence_length is enforced; the
dynamic engine's fields refuse non-defaults), InferenceRequest from a result and its
serialize / deserialize round trip, SamplingParams.streaming_interval, inference.utils."""

import pytest
import torch

from gigatron.core.inference import generate
from gigatron.core.inference.config import InferenceConfig
from gigatron.core.inference.inference_request import InferenceRequest, Status
from gigatron.core.inference.sampling_params import SamplingParams
from gigatron.core.inference.utils import Counter, InferenceMode, get_attention_mask, tensor_swap
from tests._one_rank import one_rank_fixtures
from tests.core.inference._models import MHA_LEARNED, build_model

gloo_world, single_rank = one_rank_fixtures(cuda_seed=123)


def test_inference_config_batches_and_requests_round_trip():
    model = build_model(MHA_LEARNED)
    prompts = [[3, 5, 7], [1, 2], [9, 9, 9, 4], [8]]
    params = SamplingParams(top_k=1, num_tokens_to_generate=4, return_log_probs=True)
    whole = generate(model, None, prompts, params)
    config = InferenceConfig(max_requests=3, max_sequence_length=16)
    batched = generate(model, None, prompts, params, inference_config=config)
    assert [r.generated_tokens for r in batched] == [r.generated_tokens for r in whole]
    with pytest.raises(ValueError, match=r"InferenceConfig.max_sequence_length \(6\)"):
        generate(
            model, None, prompts, params, inference_config=InferenceConfig(max_sequence_length=6)
        )

    ids = Counter(start=7)
    requests = [InferenceRequest.from_generation_result(next(ids), r, params) for r in whole]
    req = requests[2]
    assert (req.request_id, req.status, req.prompt_tokens) == (9, Status.COMPLETED, [9, 9, 9, 4])
    assert req.generated_length == 4 and req.generated_tokens == whole[2].generated_tokens
    req.prompt_log_probs = torch.tensor([0.5, -1.0])
    wire = req.serialize()
    assert wire["status"] == "COMPLETED" and wire["prompt_log_probs"] == ("tensor", [0.5, -1.0])
    back = InferenceRequest.deserialize(wire)
    assert back.sampling_params == params and back.status is Status.COMPLETED
    assert torch.equal(back.prompt_log_probs, req.prompt_log_probs)
    assert back.generated_log_probs == whole[2].generated_log_probs


def test_inference_config_refuses_dynamic_engine_fields():
    with pytest.raises(ValueError, match="block_size_tokens=16"):
        InferenceConfig(block_size_tokens=16)
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        InferenceConfig(enable_prefix_caching=True)
    with pytest.raises(ValueError, match="max_requests"):
        InferenceConfig(max_requests=0)


def test_streaming_interval_and_utils():
    assert SamplingParams(streaming_interval=3).streaming_interval == 3
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="streaming_interval"):
            SamplingParams(streaming_interval=bad)
    with pytest.raises(ValueError, match="streaming"):
        SamplingParams(streaming=True)
    assert SamplingParams.deserialize(SamplingParams(top_k=1).serialize()) == SamplingParams(
        top_k=1
    )

    mask = get_attention_mask(4, device="cpu")
    assert mask.shape == (1, 1, 4, 4)
    assert torch.equal(mask[0, 0], torch.ones(4, 4).triu(1).bool())  # True: masked
    x = torch.arange(5)
    tensor_swap(x, torch.tensor([0, 1]), torch.tensor([3, 4]))
    assert x.tolist() == [3, 4, 2, 0, 1]
    counter = Counter()
    assert [next(counter), next(counter)] == [0, 1]
    counter.reset()
    assert next(counter) == 0
    with InferenceMode.active():
        assert InferenceMode.is_active()
    assert not InferenceMode.is_active()
