"""scripts/megatron_test_results.py: every failure or skip message of Megatron's unit tests on
gigatron lands in a named class (messages as the report of Megatron-LM d98e8a64 shows them)."""

from __future__ import annotations

import sys

import pytest

from tests._paths import REPO

sys.path.insert(0, str(REPO / "scripts"))
import megatron_test_results as mtr  # noqa: E402

FAILURES = [
    ("FileNotFoundError: [Errno 2] No such file or directory: "
     "'/opt/megatron-lm/tools/preprocess_data.py'", "needs Megatron's CI data or network"),
    ("OSError: [Errno 2] No such file or directory: '/opt/data/tokenizers/gpt2-vocab.json'",
     "needs Megatron's CI data or network"),
    ("OSError: We couldn't connect to 'https://huggingface.co' to load the files",
     "needs Megatron's CI data or network"),
    ("AssertionError: Regex pattern did not match.", "gap: error message"),
    ("Failed: DID NOT WARN. No warnings of type (<class 'UserWarning'>,) were emitted.",
     "gap: missing check (no raise or warning)"),
    ("assert None is not None", "gap: different result"),
    ("AssertionError: assert False", "gap: different result"),
    ("ValueError: hidden_size (0) must be set to a positive value", "gap: gigatron checks more"),
    ("ValueError: DistributedDataParallelConfig.overlap_param_gather (True) requires "
     "use_distributed_optimizer=True", "gap: gigatron checks more"),
    ("ValueError: give --data-path PREFIX (or --mock-data for random tokens)",
     "gap: gigatron checks more"),
    ("ValueError: Group <Mock id='1'> is not registered, please create group with "
     "torch.distributed.new_group API", "gap: other torch.distributed calls"),
    ("AttributeError: <module 'megatron.core.distributed.param_and_grad_buffer' (<gigatron.compat"
     ".megatron._AliasLoader object at 0x7f>)> does not have the attribute '_pad'",
     "gap: missing name"),
    ("AssertionError: Torch not compiled with CUDA enabled", "needs CUDA"),
    ("ValueError: world size (1) is not divisible by tensor (2) x pipeline (2) x context (1) "
     "model parallel size (4)", "needs more ranks"),
    ("ValueError: world size (8) is not divisible by tensor (3) x pipeline (1) x context (1) "
     "model parallel size (3)", "world size"),
    ("RuntimeError: Grid shape [2, 4] is over sized with world size 2 and rank offset 0",
     "needs more ranks"),
    ("ValueError: world size (2) is not divisible by expert tensor (1) x expert model (4) x "
     "pipeline (1) parallel size (4)", "needs more ranks"),
    ("ValueError: parallel_state was initialized with pipeline_model_parallel_size=2 but the "
     "TransformerConfig has pipeline_model_parallel_size=1", "deliberate difference"),
    ("ValueError: _target_ 'test_base.DummyModelConfig': not in the target allowlist",
     "deliberate difference"),
    ("FileNotFoundError: [Errno 2] No such file or directory: 'msc://default/tmp/x.yaml'",
     "optional package missing"),
]  # fmt: skip
SKIPS = [
    ("Spec function is not supported", "needs Transformer Engine"),
    ("TP (2) * PP (8) > 2", "needs more ranks"),
    ("unconditional skip", "the test's own choice"),
    ("Late init of parallel_state was broken after parallel states refactor MR2988.",
     "the test's own choice"),
    ("SFTTokenizer not importable", "gap: missing name"),
    ("launcher spawns its own torchrun; run as a plain process", "runs its own launcher"),
    ("needs more ranks: tensor 2 x pipeline 4 x context 1 (expert 1 x expert tensor 2) takes 8 "
     "ranks, world size 1", "needs more ranks"),
    ("Could not load local HuggingFace tokenizer (path not available)",
     "needs Megatron's CI data or network"),
    ("Test requires world_size=8, but got 0", "needs more ranks"),
    ("requires download of the checkpoint", "needs Megatron's CI data or network"),
]  # fmt: skip


def test_the_module_walk_of_test_imports_needs_megatrons_folder_layout():
    message = "SystemExit: 1\n    ok = _test_domain_module_imports(mcore, subdomains=['models'])"
    assert mtr.classify(message) == "needs Megatron's source layout"


@pytest.mark.parametrize("message,cls", FAILURES)
def test_failure_classes(message, cls):
    assert mtr.classify(message) == cls


@pytest.mark.parametrize("message,cls", SKIPS)
def test_skip_classes(message, cls):
    assert mtr.classify(message, mtr.SKIP_RULES) == cls


def test_a_known_test_is_classified_by_its_node_id_before_its_message():
    nodeid = (
        "tests/unit_tests/training/config/test_container_base.py"
        "::TestConfigContainer_FromYaml::test_x"
    )
    message = "FileNotFoundError: [Errno 2] No such file or directory: 'test.yaml'"
    assert mtr.classify(message, nodeid=nodeid) == "deliberate difference"
    assert mtr.classify(message, nodeid="tests/unit_tests/other.py::test_x") == mtr.UNCLASSIFIED


def test_a_known_test_with_a_message_pattern_is_classified_only_by_that_message():
    """test_fast_builder's gloo cascade (after gigatron's refusal, Megatron's TempNamedDir
    deletes the shared directory on the first rank out) is known; another failure of the same
    test is classified by its own message."""
    nodeid = "tests/unit_tests/data/test_builder.py::test_fast_builder[0-20000-True-True]"
    cascade = "RuntimeError: Application timeout caused pair closure\n  barrier(...)"
    assert mtr.classify(cascade, nodeid=nodeid) == "deliberate difference"
    assert mtr.classify("RuntimeError: something new", nodeid=nodeid) == mtr.UNCLASSIFIED
    other = "tests/unit_tests/data/test_builder.py::test_builder"
    assert mtr.classify(cascade, nodeid=other) == mtr.UNCLASSIFIED


def test_megatrons_own_order_assertion_is_not_called_a_gigatron_gap():
    nodeid = (
        "tests/unit_tests/test_parallel_state.py::test_different_initialize_order_unconsistency"
        "[src_tp_pp3-2]"
    )
    message = (
        "ArgumentError: order 'tp-pp-ep-dp' does not end with 'pp', which requires expert "
        "data parallel size (1) to equal data parallel size (2)"
    )
    assert mtr.classify(message, nodeid=nodeid).startswith("fails on Megatron too")
    assert mtr.classify(message, nodeid="t.py::test_x") == "deliberate difference"


def test_a_cuda_device_index_modulo_zero_device_count_needs_cuda():
    nodeid = (
        "tests/unit_tests/test_hyper_comm_grid.py::TestHyperCommGridIntegration::"
        "test_real_distributed_rank_enumeration_verification"
    )
    message = "ZeroDivisionError: integer modulo by zero\n  torch.cuda.device_count()"
    assert mtr.classify(message, nodeid=nodeid) == "needs CUDA"


def test_a_zero_sample_split_being_none_is_not_called_a_missing_name():
    nodeid = "tests/unit_tests/data/test_builder.py::test_builder"
    message = "AttributeError: 'NoneType' object has no attribute 'datasets'"
    assert mtr.classify(message, nodeid=nodeid) == "deliberate difference"
    assert mtr.classify(message, nodeid=nodeid + "_other") == "gap: missing name"


def test_an_unknown_message_stays_unclassified():
    assert mtr.classify("RuntimeError: something new") == mtr.UNCLASSIFIED


def test_a_blocker_without_a_missing_name_is_classified_by_its_message():
    meta = {"test_counts": {"t.py": 3}}
    results = {1: {"import_errors": {"t.py": "AssertionError: Torch not compiled with CUDA"}}}
    rows = "\n".join(mtr._blockers(meta, results, [1]))
    assert "| 1 | 3 | needs CUDA |" in rows and "unclassified" not in rows


def test_an_option_value_given_as_its_own_word_is_not_a_test_path(tmp_path):
    import megatron_launch

    (tmp_path / "tests" / "unit_tests").mkdir(parents=True)
    (tmp_path / "tests" / "unit_tests" / "test_a.py").write_text("")
    rest = ["--timeout", "120", "tests/unit_tests/test_a.py::test_x", "-p", "no:cacheprovider",
            "-k", "tests", "tests/unit_tests"]  # fmt: skip
    opts, paths = megatron_launch.split_paths(tmp_path, rest)
    assert paths == ["tests/unit_tests/test_a.py::test_x", "tests/unit_tests"]
    assert opts == ["--timeout", "120", "-p", "no:cacheprovider", "-k", "tests"]
