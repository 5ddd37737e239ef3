"""bench/convert/bench_streaming.py on CPU: the tiny config end to end on one rank (the harness
runs, times each phase, and the exports are bitwise the source)."""

import pytest

from bench.convert import bench_streaming

pytestmark = pytest.mark.multirank


def test_tiny_config_reports_each_phase_and_verifies(tmp_path, capsys):
    result = bench_streaming.main(["--config", "tiny", "--dir", str(tmp_path)])
    assert result["verified"] is True
    assert result["num_files"] > 1  # sharded source: streaming over several files
    (rank,) = result["ranks"]
    for phase in (rank["import"], rank["export"], result["export_ckpt"]):
        assert phase["seconds"] > 0 and phase["rss_peak_mb"] >= phase["rss_before_mb"]
    assert rank["import"]["read_mb"] == result["checkpoint_mb"]  # one rank reads it all, once
    assert capsys.readouterr().out.startswith("RESULT {")
