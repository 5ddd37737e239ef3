"""Microbatch calculator: constant, ramp-up, rounding down, and its errors."""

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
