"""Microbatch calculator: constant, ramp-up, step schedule (megatron-core 0.19), rounding down,
and their errors."""

import pytest

from gigatron.core import num_microbatches_calculator as nmc


@pytest.fixture(autouse=True)
def _fresh():
    nmc.unset_num_microbatches_calculator()
    yield
    nmc.unset_num_microbatches_calculator()


def test_constant():
    nmc.init_num_microbatches_calculator(0, None, 32, 2, 4)
    assert nmc.get_num_microbatches() == 4
    assert nmc.get_current_global_batch_size() == 32
    assert nmc.get_micro_batch_size() == 2
    assert nmc.get_current_running_global_batch_size() == 32
    nmc.update_num_microbatches(10_000)
    assert nmc.get_num_microbatches() == 4


def test_not_divisible_is_a_clear_error():
    with pytest.raises(
        ValueError,
        match=r"global batch size \(30\).*micro batch size \(2\).*"
        r"data parallel size \(4\)",
    ):
        nmc.init_num_microbatches_calculator(0, None, 30, 2, 4)
    with pytest.raises(AssertionError, match=r"global batch size \(6\)"):  # Megatron asserts
        nmc.StepBatchsizeNumMicroBatchesCalculator(1, 4, False, 0, "0:6").update(0, True)
    # megatron-core 0.20's order: rank, global, micro, dp, decrease (ramp-up is keyword-only)
    calc = nmc._build_num_microbatches_calculator(0, 32, 8, 2, False)
    assert (calc.get(), calc.get_current_global_batch_size()) == (2, 32)
    with pytest.raises(ValueError, match="at least 1"):
        nmc.ConstantNumMicroBatchesCalculator(4, 2, 4, True, 0)


def test_decrease_batch_size_if_needed():
    nmc.init_num_microbatches_calculator(0, None, 30, 2, 4, decrease_batch_size_if_needed=True)
    assert nmc.get_num_microbatches() == 3
    assert nmc.get_current_global_batch_size() == 30
    assert nmc.get_current_running_global_batch_size() == 24


def test_init_twice_and_uninitialized():
    with pytest.raises(RuntimeError, match="not initialized"):
        nmc.get_num_microbatches()
    nmc.init_num_microbatches_calculator(0, None, 8, 1, 2)
    with pytest.raises(RuntimeError, match="already initialized"):
        nmc.init_num_microbatches_calculator(0, None, 8, 1, 2)
    with pytest.raises(AssertionError, match="already initialized"):  # Megatron's type
        nmc.init_num_microbatches_calculator(rank=0, global_batch_size=8, micro_batch_size=1,
                                             data_parallel_size=2)  # fmt: skip
    nmc.reconfigure_num_microbatches_calculator(0, None, 16, 1, 2)
    assert nmc.get_num_microbatches() == 8


def test_rampup_closed_form():
    # start 8, +8 per increment up to 32: 3 increments over 300 samples -> one every 100 samples.
    nmc.init_num_microbatches_calculator(0, [8, 8, 300], 32, 2, 2)
    expected = {0: 8, 99: 8, 100: 16, 199: 16, 200: 24, 299: 24, 300: 32, 301: 32, 10_000: 32}
    for consumed, gbs in expected.items():
        nmc.update_num_microbatches(consumed)
        assert nmc.get_current_global_batch_size() == gbs, consumed
        assert nmc.get_num_microbatches() == gbs // 4, consumed


def test_rampup_training_loop_consumes_current_batch():
    # The training loop adds the *current* global batch each step; check the trajectory.
    nmc.init_num_microbatches_calculator(0, [4, 4, 24], 16, 1, 2)
    consumed, seen = 0, []
    for _ in range(8):
        nmc.update_num_microbatches(consumed)
        seen.append(nmc.get_current_global_batch_size())
        consumed += nmc.get_current_global_batch_size()
    # per increment = 24 / 3 = 8 samples: 0->4, 4->4, 8->8, 16->12, 28->16, ...
    assert seen == [4, 4, 8, 12, 16, 16, 16, 16]


def test_rampup_errors_and_rounding():
    with pytest.raises(ValueError, match="rampup_batch_size"):
        nmc.init_num_microbatches_calculator(0, [8, 8], 32, 2, 2)
    with pytest.raises(ValueError, match=r"interval \(24\).*increment \(5\)"):
        nmc.init_num_microbatches_calculator(0, [8, 5, 100], 32, 2, 2)
    with pytest.raises(ValueError, match="start_global_batch_size"):
        nmc.init_num_microbatches_calculator(0, [64, 8, 100], 32, 2, 2)
    # start 6 with mbs*dp = 4: consistency check fails once update() is asked to check.
    nmc.init_num_microbatches_calculator(0, [6, 2, 100], 16, 2, 2)
    with pytest.raises(ValueError, match=r"global batch size \(6\)"):
        nmc.update_num_microbatches(0)
    nmc.reconfigure_num_microbatches_calculator(0, [6, 2, 100], 16, 2, 2, True)
    nmc.update_num_microbatches(0)
    assert nmc.get_current_global_batch_size() == 6
    assert nmc.get_current_running_global_batch_size() == 4
    assert nmc.get_num_microbatches() == 1


def test_step_schedule_in_samples():
    """megatron-core 0.19's step_batch_size_schedule: from each threshold on, that batch size;
    global_batch_size is not needed (the last step is the full size)."""
    nmc.init_num_microbatches_calculator(
        0, micro_batch_size=2, data_parallel_size=2, step_batch_size_schedule="0:8 1K:16 2k:32"
    )
    expected = {0: 8, 999: 8, 1000: 16, 1999: 16, 2000: 32, 10**6: 32}
    for consumed, gbs in expected.items():
        nmc.update_num_microbatches(consumed)
        assert nmc.get_current_global_batch_size() == gbs, consumed
        assert nmc.get_num_microbatches() == gbs // 4, consumed
    assert nmc._calculator().global_batch_size == 32


def test_step_schedule_in_tokens():
    # seq_length 1024: 0.5M tokens = 488 samples; entries may come unsorted, comma-separated
    nmc.init_num_microbatches_calculator(
        0, None, None, 1, 4, False, "0.5M:16, 0:4", seq_length=1024
    )
    assert nmc._calculator().schedule == [(0, 4), (488, 16)]
    nmc.update_num_microbatches(487)
    assert nmc.get_current_global_batch_size() == 4
    nmc.update_num_microbatches(488)
    assert nmc.get_num_microbatches() == 4


def test_step_schedule_errors():
    build = nmc.reconfigure_num_microbatches_calculator
    with pytest.raises(ValueError, match="cannot both be set"):
        build(0, [8, 8, 100], 32, 2, 2, step_batch_size_schedule="0:8")
    with pytest.raises(ValueError, match="decrease_batch_size_if_needed"):
        build(0, None, None, 2, 2, True, "0:8")
    with pytest.raises(ValueError, match="must start at threshold 0"):
        build(0, None, None, 2, 2, step_batch_size_schedule="10:8")
    with pytest.raises(ValueError, match="strictly increase"):
        build(0, None, None, 2, 2, step_batch_size_schedule="0:8 1K:16 1000:32")
    with pytest.raises(ValueError, match="THRESHOLD:BATCH_SIZE"):
        build(0, None, None, 2, 2, step_batch_size_schedule="0-8")
    with pytest.raises(ValueError, match="'1Q' is not a number"):
        build(0, None, None, 2, 2, step_batch_size_schedule="0:8 1Q:16")
    with pytest.raises(ValueError, match="seq_length .* needs step_batch_size_schedule"):
        build(0, None, 32, 2, 2, seq_length=1024)
    with pytest.raises(ValueError, match="global_batch_size is required"):
        build(0, None, None, 2, 2)
    with pytest.raises(ValueError, match="micro_batch_size is required"):
        build(0, None, 32)
    # 6 is not a multiple of mbs * dp = 4: checked when update() is asked to check
    build(0, None, None, 2, 2, step_batch_size_schedule="0:8 100:6")
    with pytest.raises(ValueError, match=r"global batch size \(6\)"):
        nmc.update_num_microbatches(100)
