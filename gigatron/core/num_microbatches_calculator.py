"""How many microbatches make one global batch, with optional batch-size ramp-up or steps.

Mirrors `megatron.core.num_microbatches_calculator`: one module-global calculator set by
`init_num_microbatches_calculator(...)` and read with `get_num_microbatches()`.

    global_batch_size = micro_batch_size * num_microbatches * data_parallel_size

Ramp-up (`rampup_batch_size=[start, increment, ramp_samples]`, megatron-core 0.16) grows the
global batch from `start` to `global_batch_size` in steps of `increment`, one step every
`ramp_samples / num_increments` consumed samples (Megatron's rule: `int(consumed / per_incr)`
steps taken while `consumed <= ramp_samples`). megatron-core 0.19 deprecates it (and ignores it)
for a step schedule, `step_batch_size_schedule="0:768 250B:1536 ..."`: from each threshold of
consumed samples on (tokens when `seq_length` is given: threshold // seq_length samples; suffixes
K M B T), the global batch is that entry's size. gigatron keeps both; one at a time.
"""

from __future__ import annotations

import logging

from gigatron.compat.errors import ArgumentError, StateError

logger = logging.getLogger(__name__)

_GLOBAL_NUM_MICROBATCHES_CALCULATOR: NumMicroBatchesCalculator | None = None

_FILE = "gigatron/core/num_microbatches_calculator.py"


def _calculator() -> NumMicroBatchesCalculator:
    if _GLOBAL_NUM_MICROBATCHES_CALCULATOR is None:
        raise RuntimeError(
            "num microbatches calculator is not initialized: call "
            "init_num_microbatches_calculator(...) first"
        )
    return _GLOBAL_NUM_MICROBATCHES_CALCULATOR


def get_num_microbatches() -> int:
    """Number of microbatches per global batch (per DP rank) right now."""
    return _calculator().get()


def get_current_global_batch_size() -> int:
    """Global batch size right now (changes during ramp-up)."""
    return _calculator().get_current_global_batch_size()


def get_micro_batch_size() -> int:
    """Micro batch size."""
    return _calculator().get_micro_batch_size()


def get_current_running_global_batch_size() -> int:
    """Global batch actually run: rounded down when `decrease_batch_size_if_needed`."""
    return _calculator().get_current_running_global_batch_size()


def update_num_microbatches(
    consumed_samples: int, consistency_check: bool = True, verbose: bool = False
) -> None:
    """Recompute the global batch size after `consumed_samples` samples (ramp-up only)."""
    _calculator().update(consumed_samples, consistency_check, verbose)


def init_num_microbatches_calculator(
    rank: int,
    rampup_batch_size: list[int] | None = None,
    global_batch_size: int | None = None,
    micro_batch_size: int | None = None,
    data_parallel_size: int | None = None,
    decrease_batch_size_if_needed: bool = False,
    step_batch_size_schedule: str | None = None,
    seq_length: int | None = None,
) -> None:
    """Create the global calculator; StateError (AssertionError, as Megatron asserts, and
    RuntimeError) if one already exists.

    `global_batch_size` is required unless `step_batch_size_schedule` gives the sizes."""
    global _GLOBAL_NUM_MICROBATCHES_CALCULATOR
    if _GLOBAL_NUM_MICROBATCHES_CALCULATOR is not None:
        raise StateError("num microbatches calculator is already initialized")
    _GLOBAL_NUM_MICROBATCHES_CALCULATOR = _build_num_microbatches_calculator(
        rank,
        global_batch_size,
        micro_batch_size,
        data_parallel_size,
        decrease_batch_size_if_needed,
        step_batch_size_schedule,
        seq_length,
        rampup_batch_size=rampup_batch_size,
    )


def reconfigure_num_microbatches_calculator(
    rank: int,
    rampup_batch_size: list[int] | None = None,
    global_batch_size: int | None = None,
    micro_batch_size: int | None = None,
    data_parallel_size: int | None = None,
    decrease_batch_size_if_needed: bool = False,
    step_batch_size_schedule: str | None = None,
    seq_length: int | None = None,
) -> None:
    """Replace the global calculator (no already-initialized check)."""
    global _GLOBAL_NUM_MICROBATCHES_CALCULATOR
    _GLOBAL_NUM_MICROBATCHES_CALCULATOR = _build_num_microbatches_calculator(
        rank,
        global_batch_size,
        micro_batch_size,
        data_parallel_size,
        decrease_batch_size_if_needed,
        step_batch_size_schedule,
        seq_length,
        rampup_batch_size=rampup_batch_size,
    )


def unset_num_microbatches_calculator() -> None:
    """Forget the global calculator (tests, multiple runs in one process)."""
    global _GLOBAL_NUM_MICROBATCHES_CALCULATOR
    _GLOBAL_NUM_MICROBATCHES_CALCULATOR = None


destroy_num_microbatches_calculator = unset_num_microbatches_calculator


def _build_num_microbatches_calculator(
    rank,
    global_batch_size,
    micro_batch_size,
    data_parallel_size,
    decrease,
    step_batch_size_schedule=None,
    seq_length=None,
    *,
    rampup_batch_size=None,
):
    """megatron-core 0.20's parameter order (0.20 dropped the ramp-up, gigatron keeps it as a
    keyword)."""
    for name, value in (
        ("micro_batch_size", micro_batch_size),
        ("data_parallel_size", data_parallel_size),
    ):
        if value is None:
            raise ValueError(f"{name} is required by init_num_microbatches_calculator")
    if step_batch_size_schedule is not None:
        if rampup_batch_size is not None:
            raise ValueError(
                f"rampup_batch_size ({rampup_batch_size}) and step_batch_size_schedule "
                f"({step_batch_size_schedule!r}) cannot both be set; use one"
            )
        return StepBatchsizeNumMicroBatchesCalculator(
            micro_batch_size, data_parallel_size, decrease, rank, step_batch_size_schedule,
            seq_length,
        )  # fmt: skip
    if seq_length is not None:
        raise ValueError(
            f"seq_length ({seq_length}) only converts step_batch_size_schedule thresholds from "
            "tokens to samples; it needs step_batch_size_schedule"
        )
    if global_batch_size is None:
        raise ValueError("global_batch_size is required when step_batch_size_schedule is not set")
    if rampup_batch_size is None:
        calc = ConstantNumMicroBatchesCalculator(
            global_batch_size, micro_batch_size, data_parallel_size, decrease, rank
        )
        if rank == 0:
            logger.info("setting number of microbatches to constant %d", calc.get())
        return calc
    if len(rampup_batch_size) != 3:
        raise ValueError(
            f"rampup_batch_size ({rampup_batch_size}) must be [start_global_batch_size, "
            f"batch_size_increment, rampup_samples] ({_FILE})"
        )
    start, increment, ramp_samples = (int(v) for v in rampup_batch_size)
    return RampupBatchsizeNumMicroBatchesCalculator(
        global_batch_size,
        micro_batch_size,
        data_parallel_size,
        decrease,
        rank,
        start,
        increment,
        ramp_samples,
    )


def _round_down(batch_size: int, divisor: int) -> int:
    return (batch_size // divisor) * divisor


def _check_divisible(global_batch_size: int, micro_batch_size: int, dp_size: int) -> None:
    if global_batch_size % (micro_batch_size * dp_size) != 0:
        raise ArgumentError(
            f"global batch size ({global_batch_size}) is not divisible by micro batch size "
            f"({micro_batch_size}) times data parallel size ({dp_size}) ({_FILE})"
        )


class NumMicroBatchesCalculator:
    """Base class: holds the current numbers, `update()` changes them."""

    def __init__(self) -> None:
        self.num_micro_batches: int | None = None
        self.current_global_batch_size: int | None = None
        self.micro_batch_size: int | None = None
        self.current_running_global_batch_size: int | None = None

    def get(self) -> int:
        return self.num_micro_batches

    def get_current_global_batch_size(self) -> int:
        return self.current_global_batch_size

    def get_micro_batch_size(self) -> int:
        return self.micro_batch_size

    def get_current_running_global_batch_size(self) -> int:
        return self.current_running_global_batch_size

    def update(self, consumed_samples: int, consistency_check: bool, verbose: bool = False):
        raise NotImplementedError


class ConstantNumMicroBatchesCalculator(NumMicroBatchesCalculator):
    """num_microbatches = global_batch_size / (micro_batch_size * data_parallel_size)."""

    def __init__(
        self,
        global_batch_size: int,
        micro_batch_size: int,
        data_parallel_size: int,
        decrease_batch_size_if_needed: bool,
        rank: int,
    ) -> None:
        super().__init__()
        for name, value in (
            ("global_batch_size", global_batch_size),
            ("micro_batch_size", micro_batch_size),
            ("data_parallel_size", data_parallel_size),
        ):
            if value <= 0:
                raise ValueError(f"{name} ({value}) must be positive ({_FILE})")
        mbs_times_dp = micro_batch_size * data_parallel_size
        if decrease_batch_size_if_needed:
            running = _round_down(global_batch_size, mbs_times_dp)
            if rank == 0 and running != global_batch_size:
                logger.info("decreasing batch size from %d to %d", global_batch_size, running)
        else:
            _check_divisible(global_batch_size, micro_batch_size, data_parallel_size)
            running = global_batch_size
        self.num_micro_batches = running // mbs_times_dp
        if self.num_micro_batches < 1:
            raise ValueError(
                f"number of microbatches should be at least 1, got {self.num_micro_batches} "
                f"(global_batch_size {global_batch_size} < micro_batch_size {micro_batch_size} "
                f"* data_parallel_size {data_parallel_size}) ({_FILE})"
            )
        self.current_global_batch_size = global_batch_size
        self.current_running_global_batch_size = running
        self.micro_batch_size = micro_batch_size

    def update(self, consumed_samples: int, consistency_check: bool, verbose: bool = False):
        pass


class RampupBatchsizeNumMicroBatchesCalculator(NumMicroBatchesCalculator):
    """Global batch grows from `start_global_batch_size` to `global_batch_size` by
    `batch_size_increment` every `ramup_samples / num_increments` samples."""

    def __init__(
        self,
        global_batch_size: int,
        micro_batch_size: int,
        data_parallel_size: int,
        decrease_batch_size_if_needed: bool,
        rank: int,
        start_global_batch_size: int,
        batch_size_increment: int,
        ramup_samples: int,
    ) -> None:
        super().__init__()
        for name, value in (
            ("global_batch_size", global_batch_size),
            ("micro_batch_size", micro_batch_size),
            ("data_parallel_size", data_parallel_size),
            ("start_global_batch_size", start_global_batch_size),
            ("batch_size_increment", batch_size_increment),
        ):
            if value <= 0:
                raise ValueError(f"{name} ({value}) must be positive ({_FILE})")
        if ramup_samples < 0:
            raise ValueError(f"ramup_samples ({ramup_samples}) must be non-negative ({_FILE})")
        diff = global_batch_size - start_global_batch_size
        if diff < 0:
            raise ValueError(
                f"global_batch_size ({global_batch_size}) must be >= start_global_batch_size "
                f"({start_global_batch_size}) ({_FILE})"
            )
        if diff % batch_size_increment != 0:
            raise ValueError(
                f"global batch size interval ({diff}) must be divisible by batch_size_increment "
                f"({batch_size_increment}) ({_FILE})"
            )
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size
        self.data_parallel_size = data_parallel_size
        self.decrease_batch_size_if_needed = decrease_batch_size_if_needed
        self.rank = rank
        self.start_global_batch_size = start_global_batch_size
        self.batch_size_increment = batch_size_increment
        self.ramup_samples = ramup_samples
        self.micro_batch_times_data_parallel_size = micro_batch_size * data_parallel_size
        num_increments = diff // batch_size_increment
        # With no increments the ramp is empty; any consumed count lands on global_batch_size.
        self.rampup_samples_per_increment = (
            ramup_samples / num_increments if num_increments else float("inf")
        )
        self.update(0, consistency_check=False, verbose=True)

    def update(self, consumed_samples: int, consistency_check: bool, verbose: bool = False):
        old = self.current_global_batch_size
        if consumed_samples > self.ramup_samples or self.rampup_samples_per_increment == float(
            "inf"
        ):
            self.current_global_batch_size = self.global_batch_size
        else:
            steps = int(consumed_samples / self.rampup_samples_per_increment)
            self.current_global_batch_size = (
                self.start_global_batch_size + steps * self.batch_size_increment
            )
        if self.rank == 0 and verbose and old != self.current_global_batch_size:
            logger.info("global batch size %s -> %d", old, self.current_global_batch_size)
        gbs, step = self.current_global_batch_size, self.micro_batch_times_data_parallel_size
        if consistency_check and not self.decrease_batch_size_if_needed:
            _check_divisible(gbs, self.micro_batch_size, self.data_parallel_size)
        if self.decrease_batch_size_if_needed and gbs % step != 0:
            self.current_running_global_batch_size = _round_down(gbs, step)
        else:
            self.current_running_global_batch_size = gbs
        self.num_micro_batches = self.current_running_global_batch_size // step


class StepBatchsizeNumMicroBatchesCalculator(NumMicroBatchesCalculator):
    """Global batch size from a step schedule "THRESHOLD:BS ...": from `threshold` consumed
    samples on, the batch is `BS` (thresholds in tokens when `seq_length` is given; suffixes
    K, M, B, T = 1e3 .. 1e12). The first threshold must be 0; thresholds strictly increase.
    Divisibility by micro_batch_size * data_parallel_size is checked per step in `update`
    (a resumed run may have more ranks than the early steps fit)."""

    def __init__(
        self,
        micro_batch_size: int,
        data_parallel_size: int,
        decrease_batch_size_if_needed: bool,
        rank: int,
        schedule: str,
        seq_length: int | None = None,
    ) -> None:
        super().__init__()
        if decrease_batch_size_if_needed:
            raise ValueError(
                "decrease_batch_size_if_needed cannot be used with step_batch_size_schedule"
            )
        if micro_batch_size <= 0 or data_parallel_size <= 0:
            raise ValueError(
                f"micro_batch_size ({micro_batch_size}) and data_parallel_size "
                f"({data_parallel_size}) must be positive"
            )
        if seq_length is not None and seq_length <= 0:
            raise ValueError(f"seq_length ({seq_length}) must be positive")
        self.micro_batch_size = micro_batch_size
        self.data_parallel_size = data_parallel_size
        self.rank = rank
        self.seq_length = seq_length
        self.micro_batch_times_data_parallel_size = micro_batch_size * data_parallel_size
        self.schedule = self._parse_schedule(schedule, seq_length)
        self.global_batch_size = self.schedule[-1][1]
        if rank == 0:
            unit = "tokens" if seq_length else "samples"
            logger.info("step batch size schedule %r (thresholds in %s)", schedule, unit)
        self.update(0, consistency_check=False, verbose=True)

    @staticmethod
    def _parse_numeric_value(value: str) -> int:
        text = value.strip().upper()
        scale = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}.get(text[-1:], 1)
        number = text[:-1] if scale > 1 else text
        try:
            return int(float(number) * scale)
        except ValueError:
            raise ValueError(f"step_batch_size_schedule: {value!r} is not a number") from None

    @classmethod
    def _parse_schedule(cls, schedule: str, seq_length: int | None) -> list[tuple[int, int]]:
        """[(threshold in samples, global batch size)], sorted, validated."""
        steps = []
        for entry in schedule.strip().replace(",", " ").split():
            if ":" not in entry:
                raise ValueError(
                    f"step_batch_size_schedule entry {entry!r} is not THRESHOLD:BATCH_SIZE"
                )
            threshold, batch_size = (cls._parse_numeric_value(v) for v in entry.split(":", 1))
            steps.append((threshold // seq_length if seq_length else threshold, batch_size))
        steps.sort(key=lambda step: step[0])
        if not steps or steps[0][0] != 0:
            raise ValueError(f"step_batch_size_schedule ({schedule!r}) must start at threshold 0")
        for (a, _), (b, _) in zip(steps, steps[1:]):
            if b <= a:
                raise ValueError(
                    f"step_batch_size_schedule thresholds must strictly increase (in samples: "
                    f"{a} then {b})"
                )
        bad = [bs for _, bs in steps if bs <= 0]
        if bad:
            raise ValueError(f"step_batch_size_schedule batch sizes must be positive, got {bad}")
        return steps

    def update(self, consumed_samples: int, consistency_check: bool, verbose: bool = False):
        old = self.current_global_batch_size
        self.current_global_batch_size = next(
            bs for threshold, bs in reversed(self.schedule) if consumed_samples >= threshold
        )
        if self.rank == 0 and verbose and old != self.current_global_batch_size:
            logger.info("global batch size %s -> %d", old, self.current_global_batch_size)
        if consistency_check:
            _check_divisible(
                self.current_global_batch_size, self.micro_batch_size, self.data_parallel_size
            )
        self.current_running_global_batch_size = self.current_global_batch_size
        self.num_micro_batches = (
            self.current_global_batch_size // self.micro_batch_times_data_parallel_size
        )
