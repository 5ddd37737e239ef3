"""bench/tools/fp8_convergence.py: both curves and the final validation gap from pretrain_gpt
logs."""

import json

from bench.tools import fp8_convergence as conv


def _log(final: float) -> str:
    it = (
        "iteration {i:>8}/    1000 | consumed samples: 16 | elapsed time per iteration (ms): 40.0 "
        "| learning rate: 6.0E-04 | lm loss: {loss:E} | grad norm: 1.0 | tokens/s: {tok} | MFU: 1%"
    )
    lines = [it.format(i=10, loss=9.1, tok=100), it.format(i=20, loss=8.2, tok=400)]
    lines.append(it.format(i=30, loss=7.3, tok=300))
    lines.append("validation loss at iteration 20 | lm loss value: 7.500000E+00 | lm loss PPL: 1")
    lines.append(
        f"validation loss at iteration 30 on validation set | lm loss value: {final:E} | PPL: 1"
    )
    return "\n".join(lines)


def test_curves_and_relative_gap(tmp_path, capsys):
    (tmp_path / "b.log").write_text(_log(5.0))
    (tmp_path / "f.log").write_text(_log(5.05))
    assert conv.main([str(tmp_path / "b.log"), str(tmp_path / "f.log")]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("RESULT ")]
    r = json.loads(line[len("RESULT ") :])
    assert r["bf16"]["train_loss"] == {"10": 9.1, "20": 8.2, "30": 7.3}
    assert r["bf16"]["valid_loss"] == {"20": 7.5} and r["fp8"]["final_valid_loss"] == 5.05
    assert r["bf16"]["tokens_per_s_median"] == 400.0  # the first (compiling) window left out
    assert r["final_valid_rel_diff"] == 0.01


def test_a_run_without_final_validation_fails(tmp_path, capsys):
    (tmp_path / "b.log").write_text(_log(5.0))
    (tmp_path / "f.log").write_text("iteration 10/ 1000 | lm loss: 9.0E+00 |")
    assert conv.main([str(tmp_path / "b.log"), str(tmp_path / "f.log")]) == 1
    assert "failed" in capsys.readouterr().out
