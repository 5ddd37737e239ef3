"""Mistakes copied from third-party Megatron tutorials fail with errors that say what to use.

Config fields Megatron never had, a TransformerLayer without its submodules spec, GradScaler on
the schedule's list of loss reports (docs/compat.md, "Tutorial mistakes").
"""

from __future__ import annotations

import dataclasses
import tempfile

import pytest
import torch
import torch.distributed as dist

from gigatron.compat.missing_names import NOT_MEGATRON_FIELDS
from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.pipeline_parallel.schedules import get_forward_backward_func
from gigatron.core.transformer.spec_utils import build_module
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.core.transformer.transformer_layer import TransformerLayer

BASE = dict(num_layers=1, hidden_size=16, num_attention_heads=4)


@pytest.fixture(scope="module")
def gloo_world():
    created = not dist.is_initialized()
    if created:
        dist.init_process_group(
            "gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1
        )
    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(123)
    yield
    parallel_state.destroy_model_parallel()
    if created:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "name, suggestion",
    [
        ("moe_expert_parallel_size", "expert_model_parallel_size"),
        ("moe_router_use_second_place", "moe_router_topk"),
        ("moe_min_capacity", "moe_expert_capacity_factor"),
    ],
)
def test_tutorial_config_fields_name_the_megatron_field(name, suggestion):
    with pytest.raises(TypeError, match=rf"no field '{name}'.*use {suggestion}"):
        TransformerConfig(**BASE, **{name: 2})
    TransformerConfig(**BASE, **{suggestion: 2})  # the suggestion is a real field


def test_hint_table_suggests_only_real_fields_for_names_megatron_lacks():
    ours = {f.name for f in dataclasses.fields(TransformerConfig)}
    for wrong, use in NOT_MEGATRON_FIELDS.items():
        assert wrong not in ours
        assert use.split(" ")[0].split("=")[0] in ours, (wrong, use)


def test_hint_table_names_are_not_megatron_fields_either():
    mtc = pytest.importorskip("megatron.core.transformer.transformer_config")
    theirs = {f.name for f in dataclasses.fields(mtc.TransformerConfig)}
    for wrong, use in NOT_MEGATRON_FIELDS.items():
        assert wrong not in theirs, wrong
        assert use.split(" ")[0].split("=")[0] in theirs, use


def test_misspelled_field_still_gets_closest_match():
    with pytest.raises(TypeError, match="did you mean 'num_moe_experts'"):
        TransformerConfig(**BASE, num_moe_expert=4)


def test_moe_mlp_class_does_not_exist_with_hint():
    from gigatron.core.transformer import moe

    with pytest.raises((ImportError, AttributeError), match="MoELayer"):
        moe.MoEMLP  # noqa: B018


@pytest.mark.parametrize("submodules", ["missing", None, "whole_spec"])
def test_transformer_layer_without_submodules_names_the_spec(gloo_world, submodules):
    config = TransformerConfig(**BASE)
    args = {"missing": (config,), None: (config, None)}.get(submodules)
    if submodules == "whole_spec":
        args = (config, get_gpt_layer_local_spec())
    with pytest.raises(TypeError, match=r"get_gpt_layer_local_spec\(\)"):
        TransformerLayer(*args)


def test_transformer_layer_with_spec_submodules_builds(gloo_world):
    config = TransformerConfig(**BASE)
    spec = get_gpt_layer_local_spec()
    layer = TransformerLayer(config, spec.submodules)
    assert isinstance(build_module(spec, config=config), TransformerLayer)
    out, _ = layer(torch.randn(4, 2, 16), attention_mask=None)  # [s, b, h]
    assert out.shape == (4, 2, 16)


class _Toy(torch.nn.Linear):
    """A 4 -> 1 linear with what the schedule asks of a model (config, set_input_tensor)."""

    def __init__(self):
        super().__init__(4, 1)
        self.config = TransformerConfig(**BASE)

    def set_input_tensor(self, tensor):
        pass


def _schedule_losses():
    torch.manual_seed(0)
    model = _Toy()

    def loss_func(output):
        loss = output.pow(2).mean()
        return loss, {"lm loss": loss.detach()}

    def forward_step(data_iterator, model):
        return model(next(data_iterator)), loss_func

    data = iter([torch.randn(3, 4) for _ in range(2)])
    losses = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=data, model=model, num_microbatches=2,
        seq_length=3, micro_batch_size=1, forward_only=False,
    )  # fmt: skip
    return model, losses


def test_schedule_returns_a_plain_list_of_loss_dicts(gloo_world):
    model, losses = _schedule_losses()
    assert isinstance(losses, list) and len(losses) == 2
    assert all(set(d) == {"lm loss"} for d in losses)
    assert model.weight.grad is not None  # backward already ran


@pytest.mark.parametrize("scaler_cls", ["torch.amp", "torch.cuda.amp"])
def test_grad_scaler_on_loss_list_explains_what_to_use(gloo_world, scaler_cls):
    _, losses = _schedule_losses()
    scaler = torch.amp.GradScaler("cpu") if scaler_cls == "torch.amp" else _cuda_amp_scaler()
    with pytest.raises(TypeError, match=r"grad_scale_func.*get_megatron_optimizer|"
                       r"get_megatron_optimizer.*grad_scale_func"):  # fmt: skip
        scaler.scale(losses).backward()
    with pytest.raises(TypeError, match="already ran backward"):
        losses.backward()
    with pytest.raises(AttributeError):
        losses.not_a_tensor_method  # noqa: B018


def _cuda_amp_scaler():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated / disabled without CUDA: same misuse
        return torch.cuda.amp.GradScaler(enabled=torch.cuda.is_available())


def test_megatron_tokenizer_null_library():
    """ "null": the legacy null tokenizer (EOD the extra id vocab_size)."""
    from gigatron.core.tokenizers import MegatronTokenizer

    tok = MegatronTokenizer.from_pretrained(metadata_path={"library": "null"}, vocab_size=64)
    assert tok.vocab_size == 65 and tok.eod == 64
    assert tok.tokenize("3 5 7") == [3, 5, 7]


def test_megatron_tokenizer_null_text_library_is_megatrons_text_null_tokenizer():
    """ "null-text" (Megatron 0.20's text library): vocab_size as given, EOD its last id, pad -1,
    and detokenize takes skip_special_tokens (ignored: no special tokens)."""
    from gigatron.core.tokenizers import MegatronTokenizer

    tok = MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"}, vocab_size=64)
    assert (tok.vocab_size, tok.eod, tok.pad) == (64, 63, -1)
    assert tok.tokenize("3 5 7") == [3, 5, 7]
    assert tok.detokenize([3, 5, 7], skip_special_tokens=True) == "3 5 7"


def test_megatron_tokenizer_other_library_points_to_build_tokenizer():
    from gigatron.core.tokenizers import MegatronTokenizer

    with pytest.raises(ValueError, match="build_tokenizer"):
        MegatronTokenizer.from_pretrained(metadata_path={"library": "huggingface"}, vocab_size=8)
    with pytest.raises(ValueError, match="vocab_size"):
        MegatronTokenizer.from_pretrained(metadata_path={"library": "null"})


def test_compile_helpers_is_a_no_op():
    from gigatron.core.datasets.utils import compile_helpers

    assert compile_helpers() is None
