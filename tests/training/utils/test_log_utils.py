"""gigatron.training.utils.log_utils: filters, levels, the progress log, barrier_and_log."""

import logging
from functools import partial

import pytest

from gigatron.training.utils import log_utils
from gigatron.training.utils.log_utils import (
    add_filter_to_all_loggers,
    append_to_progress_log,
    barrier_and_log,
    module_filter,
    setup_logging,
    warning_filter,
)


def _record(name="a.b", level=logging.INFO):
    return logging.LogRecord(name, level, __file__, 1, "m", None, None)


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    saved = {name: (lg.level, list(lg.filters)) for name, lg in _all_loggers()}
    yield
    for name, (level, filters) in saved.items():
        lg = logging.getLogger(name) if name else root
        lg.setLevel(level)
        lg.filters = filters


def _all_loggers():
    yield "", logging.getLogger()
    for name in list(logging.root.manager.loggerDict):
        yield name, logging.getLogger(name)


def test_warning_filter_drops_only_the_warning_level():
    assert warning_filter(_record(level=logging.WARNING)) is False
    for level in (logging.DEBUG, logging.INFO, logging.ERROR, logging.CRITICAL):
        assert warning_filter(_record(level=level)) is True


def test_module_filter_drops_by_plain_prefix():
    assert module_filter(_record("megatron.core.x"), ["megatron.core"]) is False
    assert module_filter(_record("megatronics"), ["megatron"]) is False
    assert module_filter(_record("other"), ["megatron", "apex"]) is True
    assert module_filter(_record("other"), []) is True


def test_add_filter_reaches_root_and_existing_loggers(restore_logging):
    existing = logging.getLogger("gigatron_test_existing_logger")

    def keep(record):
        return True

    add_filter_to_all_loggers(keep)
    assert keep in logging.getLogger().filters and keep in existing.filters


def test_setup_logging_level_precedence(monkeypatch, restore_logging):
    monkeypatch.delenv("MEGATRON_LOGGING_LEVEL", raising=False)
    setup_logging(filter_warning=False)
    assert logging.getLogger().level == logging.INFO
    monkeypatch.setenv("MEGATRON_LOGGING_LEVEL", str(logging.ERROR))
    setup_logging(filter_warning=False)
    assert logging.getLogger().level == logging.ERROR
    setup_logging(logging_level=logging.DEBUG, filter_warning=False)
    assert logging.getLogger().level == logging.DEBUG


def test_setup_logging_bad_env_level_names_the_value(monkeypatch, restore_logging):
    monkeypatch.setenv("MEGATRON_LOGGING_LEVEL", "loud")
    with pytest.raises(ValueError, match="'loud'"):
        setup_logging()


def test_setup_logging_levels_bridge_loggers_only_unless_asked(monkeypatch, restore_logging):
    monkeypatch.delenv("MEGATRON_LOGGING_LEVEL", raising=False)
    bridge = logging.getLogger("megatron.bridge.gigatron_test")
    other = logging.getLogger("gigatron_test_other")
    other.setLevel(logging.CRITICAL)
    setup_logging(logging_level=logging.WARNING, filter_warning=False)
    assert bridge.level == logging.WARNING and other.level == logging.CRITICAL
    setup_logging(
        logging_level=logging.WARNING, filter_warning=False, set_level_for_all_loggers=True
    )
    assert other.level == logging.WARNING


def test_setup_logging_adds_the_filters(monkeypatch, restore_logging):
    monkeypatch.delenv("MEGATRON_LOGGING_LEVEL", raising=False)
    setup_logging()
    assert warning_filter in logging.getLogger().filters
    setup_logging(filter_warning=False, modules_to_filter=["x.y"])
    added = [f for f in logging.getLogger().filters if isinstance(f, partial)]
    assert added and added[-1].keywords == {"modules_to_filter": ["x.y"]}


def test_progress_log_lines_on_rank_zero(tmp_path, monkeypatch):
    monkeypatch.setattr(log_utils, "safe_get_rank", lambda: 0)
    monkeypatch.setattr(log_utils, "safe_get_world_size", lambda: 4)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    append_to_progress_log(str(tmp_path / "run"), "first", barrier=False)
    append_to_progress_log(str(tmp_path / "run"), "second", barrier=False)
    lines = (tmp_path / "run" / "progress.txt").read_text().splitlines()
    assert len(lines) == 2
    assert lines[0].split("\t")[1:] == ["Job ID: 77", "# GPUs: 4", "first"]
    append_to_progress_log(None, "nothing", barrier=False)  # no save dir: no-op


def test_progress_log_is_rank_zero_only(tmp_path, monkeypatch):
    monkeypatch.setattr(log_utils, "safe_get_rank", lambda: 1)
    append_to_progress_log(str(tmp_path), "x", barrier=False)
    assert not (tmp_path / "progress.txt").exists()


def test_barrier_and_log_prints_the_stamped_message(capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    barrier_and_log("ready")
    out = capsys.readouterr().out
    assert out.startswith("[ready] datetime: ")
