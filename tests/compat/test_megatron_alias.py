"""The opt-in `megatron` alias: off by default, resolves to the same gigatron modules when on."""

import subprocess
import sys
import textwrap


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )


def test_alias_resolves_to_gigatron_modules():
    r = _run("""
        import gigatron.compat.megatron as alias
        alias.install()
        from megatron.core import parallel_state
        import megatron.core.tensor_parallel as tp
        from megatron.training import get_args, print_rank_0
        from megatron.training.tokenizer.tokenizer import _NullTokenizer
        import gigatron.core.parallel_state, gigatron.core.tensor_parallel
        assert parallel_state is gigatron.core.parallel_state
        assert tp is gigatron.core.tensor_parallel
        assert _NullTokenizer(10).vocab_size >= 10
        try:
            import megatron.legacy
        except ImportError as e:
            assert "megatron.legacy" in str(e)
        else:
            raise AssertionError("megatron.legacy should not resolve")
        print("ok")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_nothing_named_megatron_without_the_switch():
    r = _run("""
        import sys
        import gigatron.core.parallel_state, gigatron.training
        assert not [m for m in sys.modules if m.split('.')[0] == 'megatron'], sys.modules.keys()
        print("ok")
    """)
    assert r.returncode == 0, r.stderr


def test_runs_a_script(tmp_path):
    script = tmp_path / "uses_megatron.py"
    script.write_text(
        "import sys\n"
        "from megatron.core import parallel_state as ps\n"
        "print('tp', ps.get_tensor_model_parallel_world_size(), sys.argv[1:])\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "gigatron.compat.megatron", str(script), "--x", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "tp 1 ['--x', '1']"
