"""Behaviour of the signature fixes found by test_api_surface_vs_megatron.py.

Each test calls the fixed name the way a megatron-core 0.16.1 script does (keyword names,
defaults) and checks the result, against megatron-core itself where it runs on CPU.
"""

import contextlib
import tempfile
import warnings

import pytest
import torch.distributed as dist

from gigatron.core import parallel_state as ps


@contextlib.contextmanager
def _one_process_world():
    created = not dist.is_initialized()
    if created:
        dist.init_process_group(
            "gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1
        )
    try:
        yield
    finally:
        ps.destroy_model_parallel()
        if created:
            dist.destroy_process_group()


@pytest.mark.parametrize(
    "setter,getter,param",
    [
        (
            "set_tensor_model_parallel_world_size",
            "get_tensor_model_parallel_world_size",
            "world_size",
        ),
        ("set_tensor_model_parallel_rank", "get_tensor_model_parallel_rank", "rank"),
        (
            "set_pipeline_model_parallel_world_size",
            "get_pipeline_model_parallel_world_size",
            "world_size",
        ),
        ("set_pipeline_model_parallel_rank", "get_pipeline_model_parallel_rank", "rank"),
        (
            "set_expert_model_parallel_world_size",
            "get_expert_model_parallel_world_size",
            "world_size",
        ),
        ("set_expert_model_parallel_rank", "get_expert_model_parallel_rank", "rank"),
        (
            "set_expert_tensor_parallel_world_size",
            "get_expert_tensor_parallel_world_size",
            "world_size",
        ),
        ("set_expert_tensor_parallel_rank", "get_expert_tensor_parallel_rank", "rank"),
        ("set_data_parallel_rank", "get_data_parallel_rank", "rank"),
    ],
)
def test_fake_init_setters_take_megatron_keywords(setter, getter, param):
    """NeMo-style fake init: `set_*_rank(rank=...)` / `set_*_world_size(world_size=...)`."""
    getattr(ps, setter)(**{param: 3})
    try:
        assert getattr(ps, getter)() == 3
    finally:
        getattr(ps, setter)(**{param: None})


@pytest.mark.parametrize(
    "world_size,parallel_size,mask",
    [
        (16, [2, 2, 2, 2], [True, False, False, False]),
        (16, [2, 2, 2, 2], [False, True, True, False]),
        (24, [2, 3, 4], [True, False, True]),
        (8, [8], [True]),
        (12, [3, 1, 4], [False, True, True]),
    ],
)
def test_generate_masked_orthogonal_rank_groups_matches_megatron(world_size, parallel_size, mask):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mps = pytest.importorskip("megatron.core.parallel_state")
    want = mps.generate_masked_orthogonal_rank_groups(world_size, parallel_size, mask)
    assert ps.generate_masked_orthogonal_rank_groups(world_size, parallel_size, mask) == want


def test_create_all_gather_group_accepted_at_default_refused_otherwise():
    with _one_process_world():
        ps.initialize_model_parallel(1, 1, create_all_gather_group=False)
        assert ps.get_data_parallel_group(independent_all_gather=False) is (
            ps.get_data_parallel_group()
        )
        with pytest.raises(ValueError, match="independent_all_gather"):
            ps.get_data_parallel_group(with_context_parallel=True, independent_all_gather=True)
        ps.destroy_model_parallel()
        with pytest.raises(ValueError, match="create_all_gather_group"):
            ps.initialize_model_parallel(1, 1, create_all_gather_group=True)


def test_moe_dispatchers_default_to_parallel_state_groups():
    """Megatron's `pg_collection=None`: the dispatcher takes parallel_state's expert groups."""
    from gigatron.core.transformer.moe.token_dispatcher import (
        MoEAllGatherTokenDispatcher,
        MoEAlltoAllTokenDispatcher,
    )
    from gigatron.core.transformer.transformer_config import TransformerConfig

    with _one_process_world():
        ps.initialize_model_parallel(1, 1)
        config = TransformerConfig(
            num_layers=1, hidden_size=16, num_attention_heads=2, num_moe_experts=2
        )
        for cls in (MoEAllGatherTokenDispatcher, MoEAlltoAllTokenDispatcher):
            dispatcher = cls(2, [0, 1], config)
            assert dispatcher.ep_group is ps.get_expert_model_parallel_group()
            assert dispatcher.tp_group is ps.get_expert_tensor_parallel_group()
            assert dispatcher.tp_ep_group is ps.get_expert_tensor_and_model_parallel_group()


def test_core_enums_model_type_is_the_transformer_one():
    """`megatron.core.enums.ModelType` (what pretrain scripts import) exists and is the same
    enum as `transformer.enums.ModelType`, so either spelling passes pretrain's checks."""
    from gigatron.core.enums import ModelType
    from gigatron.core.transformer.enums import ModelType as TransformerModelType

    assert ModelType is TransformerModelType
    assert ModelType.encoder_or_decoder.value == 1
    with pytest.raises(ValueError, match="encoder_or_decoder"):
        ModelType.encoder_or_decoder.encoder_and_decoder  # noqa: B018


def test_gpt_spec_functions_take_megatron_keywords():
    """The spec functions take Megatron's keywords explicitly (no catch-all **kwargs): switches
    for the same math are accepted, features gigatron lacks raise, unknown names raise."""
    from gigatron.core.models.gpt import gpt_layer_specs as specs

    te = specs.get_gpt_layer_with_transformer_engine_spec
    assert te(use_te_op_fuser=True, use_te_activation_func=True) == te()
    assert specs.get_mlp_module_spec() == specs.get_mlp_module_spec(use_te=False)
    assert specs.get_mlp_module_spec(num_experts=4) == specs.get_mlp_module_spec(
        use_te=False, num_experts=4
    )
    refused = [
        (te, {"use_kitchen": True}),
        (te, {"use_kitchen_attention": True}),
        (te, {"kitchen_attention_backend": "fa"}),
        (te, {"mla_down_proj_fusion": True}),
        (te, {"use_grouped_gemm_for_dense_mlp": True}),
        (te, {"moe_use_legacy_grouped_gemm": True}),
        (specs.get_gpt_layer_local_spec, {"use_kitchen_attention": True}),
        (specs.get_gpt_layer_local_spec, {"moe_use_legacy_grouped_gemm": True}),
        (specs.get_mlp_module_spec, {"fp8": "e4m3"}),
        (specs.get_mlp_module_spec, {"moe_use_legacy_grouped_gemm": True}),
    ]
    for fn, kwargs in refused:
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            fn(**kwargs)
    with pytest.raises(TypeError):
        specs.get_gpt_layer_local_spec(qk_layer_norm=True)  # a typo is no longer swallowed


@pytest.mark.parametrize("vocab_size", [None, 100, 65536, 65537, 200_000])
def test_gpt_dataset_config_token_dtype_code_matches_megatron(vocab_size):
    """`token_dtype_code` is a declared, derived (init=False) field as in Megatron."""
    import dataclasses

    from gigatron.core.datasets.gpt_dataset import GPTDatasetConfig

    class _Tok:
        eod, pad = 0, -1

    tok = _Tok()
    tok.vocab_size = vocab_size
    kwargs = dict(random_seed=1, sequence_length=8, tokenizer=tok, reset_position_ids=False,
                  reset_attention_mask=False, eod_mask_loss=False)  # fmt: skip
    ours = GPTDatasetConfig(**kwargs)
    field = {f.name: f for f in dataclasses.fields(GPTDatasetConfig)}["token_dtype_code"]
    assert field.init is False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mgpt = pytest.importorskip("megatron.core.datasets.gpt_dataset")
    theirs = mgpt.GPTDatasetConfig(**kwargs)
    assert ours.token_dtype_code == theirs.token_dtype_code


def test_default_sharded_strategies_round_trip(tmp_path):
    """Megatron's `save(..., get_default_save_sharded_strategy())` and
    `load(..., get_default_load_sharded_strategy(dir))` work and move the same tensors."""
    import torch

    from gigatron.core import dist_checkpointing as dcp
    from gigatron.core.dist_checkpointing.core import CheckpointingException
    from gigatron.core.dist_checkpointing.serialization import (
        get_default_load_sharded_strategy,
        get_default_save_sharded_strategy,
    )

    weight = torch.arange(12.0).view(3, 4)
    with _one_process_world():
        save_strategy = get_default_save_sharded_strategy()
        assert (save_strategy.backend, save_strategy.version) == ("torch_dist", 1)
        dcp.save({"w": dcp.ShardedTensor.from_rank_offsets("w", weight)}, str(tmp_path),
                 sharded_strategy=save_strategy)  # fmt: skip
        load_strategy = get_default_load_sharded_strategy(str(tmp_path))
        target = {"w": dcp.ShardedTensor.from_rank_offsets("w", torch.zeros(3, 4))}
        loaded = dcp.load(target, str(tmp_path), sharded_strategy=load_strategy)
        assert torch.equal(loaded["w"], weight)
    with pytest.raises(CheckpointingException):
        get_default_load_sharded_strategy(str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="zarr"):
        get_default_save_sharded_strategy("zarr")


def test_timers_barrier_keyword_and_write(capsys):
    """Timers.log / get_all_timers_string take Megatron's `barrier`; Timers.write exports
    `<name>-time` (seconds / normalizer, max over ranks) to a TensorBoard- or W&B-style writer
    and skips timers no rank ran."""
    import time

    from gigatron.core.timers import Timers

    class _TB:
        def __init__(self):
            self.rows = []

        def add_scalar(self, tag, value, step):
            self.rows.append((tag, value, step))

    class _WandB:
        def __init__(self):
            self.rows = []

        def log(self, data, step):
            self.rows.append((data, step))

    with _one_process_world():
        timers = Timers(log_level=2)
        timers("a").start()
        time.sleep(0.01)
        timers("a").stop()
        timers("idle")  # registered, never run
        assert timers.get_all_timers_string(["a"], reset=False, barrier=True).startswith(
            "(max over ranks, ms) a: "
        )
        timers.log(["a"], reset=False, barrier=True)
        assert "a: " in capsys.readouterr().out
        tb, wb = _TB(), _WandB()
        timers.write(["a", "idle", "absent"], tb, 7, normalizer=2.0, reset=False, barrier=True)
        timers.write(["a"], wb, 7, normalizer=2.0, reset=True)
        timers.write(["a"], None, 8)  # non-logging rank: reduction only
        ((tag, value, step),) = tb.rows
        assert tag == "a-time" and step == 7 and 0.005 <= value < 1.0  # >= 0.01 s / 2
        assert wb.rows == [({"a-time": value}, 7)]
        with pytest.raises(ValueError, match="normalizer"):
            timers.write(["a"], tb, 9, normalizer=0.0)


@pytest.mark.parametrize("as_dicts", [False, True])
def test_extract_matching_values_matches_megatron(as_dicts):
    """`return_lists_as_dicts` keeps list positions as dict keys, exactly as Megatron."""
    from gigatron.core.dist_checkpointing.dict_utils import extract_matching_values

    x = {
        "a": [1, "s", [2, "t", {"b": 3}], {"c": "u"}],
        "d": {"e": 4, "f": ["v", 5]},
        "g": "w",
        "h": [6, 7],
        "i": ["x"],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mdict = pytest.importorskip("megatron.core.dist_checkpointing.dict_utils")
    is_int = lambda v: isinstance(v, int)  # noqa: E731
    want = mdict.extract_matching_values(x, is_int, return_lists_as_dicts=as_dicts)
    assert extract_matching_values(x, is_int, return_lists_as_dicts=as_dicts) == want


def test_async_calls_queue_megatron_keywords():
    """AsyncCallsQueue(persistent=...), schedule_async_request(async_request=...) and
    close(abort=...): abort drops pending saves unfinalized, a plain close finalizes them."""
    from gigatron.core.dist_checkpointing.strategies.async_utils import (
        AsyncCallsQueue,
        AsyncRequest,
    )

    for abort in (True, False):
        written, finalized = [], []
        queue = AsyncCallsQueue(persistent=True)
        request = AsyncRequest(written.append, (1,), [lambda f=finalized: f.append(1)])
        assert queue.schedule_async_request(async_request=request) == 0
        queue.close(abort=abort)
        assert queue.get_num_unfinalized_calls() == 0
        assert finalized == ([] if abort else [1])


def _megatron_only_cases():
    from gigatron.compat import megatron_only_fields as mof

    return [("mpc", n, d) for n, (d, _) in mof.PARALLEL.items()] + [
        ("tc", n, d) for n, (d, _) in mof.TRANSFORMER.items()
    ]


def _tiny(**kw):
    from gigatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2, **kw)


def test_megatron_only_fields_at_default_construct_like_megatron():
    """A Megatron config that spells out every such field at its default constructs, and the
    values read back are Megatron's defaults (megatron-core's own dataclass fields)."""
    import dataclasses

    from gigatron.compat import megatron_only_fields as mof
    from gigatron.core.model_parallel_config import ModelParallelConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mtc = pytest.importorskip("megatron.core.transformer.transformer_config")
    theirs = {}
    for f in dataclasses.fields(mtc.TransformerConfig):
        if f.default is not dataclasses.MISSING:
            theirs[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            theirs[f.name] = f.default_factory()
    # the installed megatron-core's fields: 0.16 lacks those 0.19 added, 0.19 dropped
    # moe_use_legacy_grouped_gemm; defaults 0.19 changed are accepted either way
    every = {n: d for _, n, d in _megatron_only_cases() if n in theirs}
    differ = {
        n: (theirs[n], d)
        for n, d in every.items()
        if theirs[n] != d and theirs[n] not in mof.OLDER_DEFAULTS.get(n, ())
    }
    assert len(every) >= 90 and not differ, differ  # fields leave as gigatron implements them
    config = _tiny(**{n: theirs[n] for n in every})
    assert all(getattr(config, n) == theirs[n] for n in every)
    par = [n for n in mof.PARALLEL if n in theirs]
    parallel = ModelParallelConfig(**{n: theirs[n] for n in par})
    assert all(getattr(parallel, n) == theirs[n] for n in par)
    # the mutable default is one list per config, as with Megatron's default_factory
    assert _tiny().offload_modules == [] and _tiny().offload_modules is not config.offload_modules


@pytest.mark.parametrize("owner,name,default", _megatron_only_cases())
def test_megatron_only_field_off_default_raises(owner, name, default):
    from gigatron.core.model_parallel_config import ModelParallelConfig

    other = (
        {True: False, False: True}.get(default, "x")
        if isinstance(default, bool | type(None))
        else (
            ["x"]
            if isinstance(default, list)
            else ("x" if isinstance(default, str) else default + 1)
        )
    )
    build = _tiny if owner == "tc" else ModelParallelConfig
    from gigatron.compat import megatron_only_fields as mof

    if other in mof.OLDER_DEFAULTS.get(name, ()):  # 0.16's default: both bool values accepted
        build(**{name: other})
        return
    with pytest.raises(ValueError, match=name):
        build(**{name: other})


def test_hyper_comm_grid_enumeration_matches_megatron(monkeypatch):
    """Rank lists of gigatron's HyperCommGrid: Megatron's documented example, the same group
    sets as megatron-core's RankGenerator for the equivalent order string (single axes in the
    same order), and megatron-core's own group keys."""
    from gigatron.core.hyper_comm_grid import HyperCommGrid

    monkeypatch.setenv("WORLD_SIZE", "120")
    example = HyperCommGrid([2, 2, 2], ["a", "b", "c"])
    assert example._gen_rank_enum(["a", "b"]) == [[0, 2, 1, 3], [4, 6, 5, 7]]  # Megatron's doc
    assert example.get_rank_enum(["a", "b"]) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # dims ordered first
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mps = pytest.importorskip("megatron.core.parallel_state")
        mgrid = pytest.importorskip("megatron.core.hyper_comm_grid")
    names, shape = ["tp", "cp", "pp", "dp"], [2, 3, 4, 5]
    grid = HyperCommGrid(shape, names)
    theirs_grid = mgrid.HyperCommGrid(shape, names)
    gen = mps.RankGenerator(tp=2, ep=1, dp=5, pp=4, cp=3, order="tp-cp-pp-dp")
    for dims in ("tp", "cp", "pp", "dp", ["cp", "dp"], ["tp", "pp"], ["tp", "cp", "dp"]):
        ours = grid.get_rank_enum(dims)
        token = "-".join(dims) if isinstance(dims, list) else dims
        want = gen.get_ranks(token)
        if isinstance(dims, str):
            assert ours == want
        assert sorted(map(sorted, ours)) == sorted(map(sorted, want))
        if hasattr(theirs_grid, "_order_dims"):  # megatron-core 0.16
            ordered, key = theirs_grid._order_dims(dims)
        else:  # 0.19 renamed it
            ordered, key = theirs_grid._order_dims_for(names, dims)
        assert grid._key(dims, None) == (key, grid._view(None), ordered)
    offset = HyperCommGrid([2, 2], ["tp", "dp"], rank_offset=4)
    assert offset.get_rank_enum("dp") == [[4, 6], [5, 7]]
    with pytest.raises(RuntimeError, match="over sized"):
        HyperCommGrid([11, 11], ["tp", "dp"])


def test_optimizer_config_megatron_only_fields_default_only():
    """OptimizerConfig declares megatron-core's FP8 / Muon fields: a script passing them at
    Megatron's defaults constructs; any other value is refused by name."""
    import warnings

    from gigatron.core.optimizer import OptimizerConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
    theirs = MegatronOptimizerConfig()
    names = ["fp8_recipe", "reuse_grad_buf_for_mxfp8_param_ag", "muon_momentum", "muon_tp_mode"]
    cfg = OptimizerConfig(**{n: getattr(theirs, n) for n in names})
    assert all(getattr(cfg, n) == getattr(theirs, n) for n in names)
    with pytest.raises(ValueError, match=r"muon_momentum=0\.9 is not supported .*Muon"):
        OptimizerConfig(muon_momentum=0.9)
    with pytest.raises(ValueError, match=r"fp8_recipe='mxfp8' is not supported"):
        OptimizerConfig(fp8_recipe="mxfp8")


def test_every_megatron_core_config_field_at_its_default_constructs():
    """A config spelling out every field of the installed megatron-core's TransformerConfig,
    ModelParallelConfig, OptimizerConfig, DistributedDataParallelConfig at its default constructs
    in gigatron (run against 0.16.1 and 0.19.2): scripts and saved configs of either version."""
    import dataclasses
    import importlib

    pairs = [
        ("transformer.transformer_config", "TransformerConfig"),
        ("model_parallel_config", "ModelParallelConfig"),
        ("optimizer.optimizer_config", "OptimizerConfig"),
        ("distributed.distributed_data_parallel_config", "DistributedDataParallelConfig"),
    ]
    required = {"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2}
    for module, name in pairs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = getattr(pytest.importorskip(f"megatron.core.{module}"), name)
        ours = getattr(importlib.import_module(f"gigatron.core.{module}"), name)
        kwargs = {}
        for f in dataclasses.fields(theirs):
            if not f.init:
                continue
            if f.default is not dataclasses.MISSING:
                kwargs[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                kwargs[f.name] = f.default_factory()
            else:
                kwargs[f.name] = required[f.name]
        kwargs.update({k: v for k, v in required.items() if k in kwargs})  # num_layers: 0
        ours(**kwargs)


def test_megatron_core_0_16_defaults_accepted():
    """Where megatron-core 0.19 / 0.20 changed a default (gigatron's now), the older one
    constructs as well; other values fail."""
    from gigatron.compat import megatron_only_fields as mof
    from gigatron.core.optimizer import OptimizerConfig

    older = {n: d[0] for n, d in mof.OLDER_DEFAULTS.items() if n in mof.TRANSFORMER}
    assert OptimizerConfig().muon_tp_mode == "duplicated"  # 0.20's default
    assert OptimizerConfig(muon_tp_mode="blockwise").muon_tp_mode == "blockwise"  # 0.16 / 0.19
    with pytest.raises(ValueError, match="muon_tp_mode"):
        OptimizerConfig(muon_tp_mode="distributed")
    assert _tiny().cuda_graph_scope is None and _tiny().moe_deepep_num_sms is None
    assert _tiny(**older).cuda_graph_scope == "full"
    with pytest.raises(ValueError, match="moe_deepep_num_sms"):
        _tiny(moe_deepep_num_sms=8)
