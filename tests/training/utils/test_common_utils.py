"""gigatron.training.utils.common_utils: rank printing, reductions, argument helpers."""

import json
from types import SimpleNamespace

import pytest
import torch

from gigatron.training import utils
from gigatron.training.utils import common_utils
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures(cuda_seed=None)


def test_package_keeps_the_old_module_names():
    for name in ("print_rank_0", "print_rank_last", "is_last_rank"):
        assert getattr(utils, name) is getattr(common_utils, name)
    assert utils.log_utils.append_to_progress_log is utils.append_to_progress_log


def test_print_rank_0_honours_an_explicit_rank(capsys):
    common_utils.print_rank_0("shown")
    common_utils.print_rank_0("hidden", rank=1)
    assert capsys.readouterr().out == "shown\n"


def test_reductions_on_one_rank():
    losses = [torch.tensor(2.0), torch.tensor(4.0)]
    assert common_utils.average_losses_across_data_parallel_group(losses).tolist() == [2.0, 4.0]
    assert common_utils.reduce_max_stat_across_model_parallel_group(None) is None
    assert common_utils.reduce_max_stat_across_model_parallel_group(3.5) == 3.5
    assert common_utils.logical_and_across_model_parallel_group(True) is True
    assert common_utils.logical_and_across_model_parallel_group(False) is False


def test_params_norm_counts_tied_copies_once(monkeypatch):
    model = torch.nn.Linear(3, 4, bias=False)
    torch.nn.init.constant_(model.weight, 1.0)
    monkeypatch.setattr(common_utils, "get_args", lambda: SimpleNamespace(bf16=False))
    assert common_utils.calc_params_l2_norm(model) == pytest.approx(12**0.5)
    model.weight.shared = True  # a tied copy held elsewhere: not counted here
    assert common_utils.calc_params_l2_norm([model]) == 0.0


def test_params_norm_bf16_reads_main_param_unless_forced(monkeypatch):
    model = torch.nn.Linear(2, 2, bias=False).to(torch.bfloat16)
    torch.nn.init.constant_(model.weight, 1.0)
    model.weight.main_param = torch.full((2, 2), 2.0)
    monkeypatch.setattr(common_utils, "get_args", lambda: SimpleNamespace(bf16=True))
    assert common_utils.calc_params_l2_norm(model) == pytest.approx(4.0)
    assert common_utils.calc_params_l2_norm(model, force_create_fp32_copy=True) == 2.0


def test_first_or_last_pipeline_stage_on_one_stage():
    assert common_utils.is_first_or_last_pipeline_stage(None)


def test_device_arch_version_without_cuda_raises(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA"):
        common_utils.get_device_arch_version()


def _data_args(**kw):
    base = dict(data_path=None, data_args_path=None, per_split_data_args_path=None)
    base |= dict(train_data_path=None, valid_data_path=None, test_data_path=None)
    return SimpleNamespace(**(base | kw))


def test_blend_from_data_path_or_per_split(tmp_path):
    blend, per_split = common_utils.get_blend_and_blend_per_split(
        _data_args(data_path=["30", "a", "70", "b"])
    )
    assert blend == (["a", "b"], [30.0, 70.0]) and per_split is None
    blend, per_split = common_utils.get_blend_and_blend_per_split(
        _data_args(train_data_path=["t"], test_data_path=["x"])
    )
    assert blend is None and per_split == [(["t"], None), None, (["x"], None)]
    path = tmp_path / "splits.json"
    path.write_text(json.dumps({"train": "1 a 3 b", "valid": ["v"], "test": ["w"]}))
    _, per_split = common_utils.get_blend_and_blend_per_split(
        _data_args(per_split_data_args_path=str(path))
    )
    assert per_split[0] == (["a", "b"], [1.0, 3.0])
    assert common_utils.get_blend_and_blend_per_split(_data_args()) == (None, None)


def test_blend_rejects_both_data_path_and_args_path(tmp_path):
    with pytest.raises(ValueError, match="not both"):
        common_utils.get_blend_and_blend_per_split(
            _data_args(data_path=["a"], data_args_path=str(tmp_path / "f"))
        )


def test_local_rank_preinit_order(monkeypatch):
    for name in ("LOCAL_RANK", "SLURM_NTASKS", "SLURM_LOCALID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.warns(UserWarning, match="Could not determine local rank"):
        assert common_utils.get_local_rank_preinit() == 0
    monkeypatch.setenv("SLURM_LOCALID", "5")
    with pytest.warns(UserWarning):  # SLURM_LOCALID counts only inside a SLURM job
        assert common_utils.get_local_rank_preinit() == 0
    monkeypatch.setenv("SLURM_NTASKS", "8")
    assert common_utils.get_local_rank_preinit() == 5
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert common_utils.get_local_rank_preinit() == 2


def test_to_empty_if_meta_device_keeps_real_values():
    module = torch.nn.Linear(2, 2)
    with torch.device("meta"):
        module.extra = torch.nn.Linear(2, 2)
    weight = module.weight.detach().clone()
    common_utils.to_empty_if_meta_device(module, device=torch.device("cpu"))
    assert module.extra.weight.device.type == "cpu"
    assert torch.equal(module.weight, weight)


def test_update_use_dist_ckpt():
    args = SimpleNamespace(ckpt_format="torch")
    common_utils.update_use_dist_ckpt(args)
    assert args.use_dist_ckpt is False
    args.ckpt_format = "torch_dist"
    common_utils.update_use_dist_ckpt(args)
    assert args.use_dist_ckpt is True
