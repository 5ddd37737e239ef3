"""DataLoader workers ignore the signal `--exit-signal-handler` owns (their parent decides), and a
caller's own `worker_init_fn` still runs. End to end under torchrun:
tests/training/test_exit_signal_handler.py."""

import signal
from types import SimpleNamespace

import pytest

from gigatron.training.data_samplers import build_pretraining_data_loader, exit_signal_number

_INIT = {"ran": False}


def _mark(worker_id):
    _INIT["ran"] = True


class _Dispositions:
    """Each sample: (SIGUSR1 ignored?, SIGTERM ignored?, the caller's init ran?) in the worker."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        ign = signal.SIG_IGN
        return [
            signal.getsignal(signal.SIGUSR1) == ign,
            signal.getsignal(signal.SIGTERM) == ign,
            _INIT["ran"],
        ]


def _args(handler: bool, exit_signal: str | None = "SIGUSR1"):
    return SimpleNamespace(
        micro_batch_size=1, num_workers=1, seed=1, exit_signal_handler=handler,
        exit_signal=exit_signal,
    )  # fmt: skip


@pytest.mark.parametrize("handler", [True, False])
def test_workers_ignore_the_exit_signal_and_run_the_callers_init(handler):
    loader = build_pretraining_data_loader(_Dispositions(), 0, _args(handler), _mark)
    usr1, term, ran = (bool(x) for x in next(iter(loader)))
    assert (usr1, term, ran) == (handler, False, True)  # only the handler's signal, only if on


def test_exit_signal_number():
    assert exit_signal_number(_args(True, None)) == signal.SIGTERM
    assert exit_signal_number(_args(True, "SIGUSR2")) == signal.SIGUSR2
    assert exit_signal_number(SimpleNamespace()) == signal.SIGTERM
