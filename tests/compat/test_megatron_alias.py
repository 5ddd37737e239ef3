"""The opt-in `megatron` alias: off by default, resolves to the same gigatron modules when on."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.multirank


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
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
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "tp 1 ['--x', '1']"


def _launch(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gigatron.compat.megatron", *args],
        capture_output=True, text=True, timeout=300, cwd=cwd, env=env,
    )  # fmt: skip


def test_dash_c_runs_code_with_python_argv():
    r = _launch("-c", "import sys\nfrom megatron.core import parallel_state\nprint(sys.argv)", "a")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['-c', 'a']"


def test_dash_m_runs_a_module(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "job.py").write_text(
        "import sys\nfrom megatron.core import parallel_state\n"
        "if __name__ == '__main__':\n    print('job', sys.argv[1:])\n"
    )
    r = _launch("-m", "pkg.job", "--x", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "job ['--x']"


def test_unknown_option_is_one_line():
    r = _launch("--nproc-per-node", "2", "script.py")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "unknown option --nproc-per-node" in r.stderr.splitlines()[0]


def test_one_process_gets_torchrun_environment(tmp_path):
    script = tmp_path / "init.py"
    script.write_text(
        "import torch.distributed as dist\nfrom megatron.core import parallel_state\n"
        "dist.init_process_group('gloo')\nparallel_state.initialize_model_parallel()\n"
        "print('world', dist.get_world_size(), 'rank', dist.get_rank())\n"
        "dist.destroy_process_group()\n"
    )
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in keys}
    r = _launch(str(script), env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "world 1 rank 0"


def test_missing_seed_call_is_not_blamed_on_cuda(tmp_path):
    script = tmp_path / "no_seed.py"
    script.write_text(
        "from megatron.core.tensor_parallel import get_cuda_rng_tracker\n"
        "with get_cuda_rng_tracker().fork():\n    pass\n"
    )
    r = _launch(str(script))
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert "model_parallel_cuda_manual_seed(seed)" in last and "needed on CPU too" in last, last
    assert "no CUDA device" not in r.stderr


_TORCHRUN_KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def _clear_launch_env(monkeypatch) -> None:
    """Unset the launch variables so that monkeypatch restores them (and removes what the code
    under test sets) when the test ends: a bare delenv of an unset name records nothing."""
    for key in _TORCHRUN_KEYS:
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)


@pytest.mark.parametrize("launcher", ["SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])
def test_several_tasks_of_srun_or_mpirun_get_no_one_process_defaults(launcher, monkeypatch, capsys):
    from gigatron.compat.megatron import _single_process_env

    _clear_launch_env(monkeypatch)
    monkeypatch.setenv(launcher, "4")
    _single_process_env()
    assert not [k for k in _TORCHRUN_KEYS if k in os.environ]
    err = capsys.readouterr().err
    assert f"{launcher}=4" in err and "torchrun" in err and err.count("\n") == 1, err


def test_one_task_of_srun_gets_one_process_defaults(monkeypatch):
    from gigatron.compat.megatron import _single_process_env

    _clear_launch_env(monkeypatch)
    monkeypatch.setenv("SLURM_NTASKS", "1")
    _single_process_env()
    assert os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] == "1"


def test_importing_megatron_core_allows_its_checkpoint_classes_as_megatron_does():
    """`import megatron.core` (through the alias) registers SAFE_GLOBALS for weights-only
    torch.load, as Megatron's own import does; `import gigatron.core` leaves torch alone."""
    r = _run("""
        import argparse, io, pickle, torch
        buf = io.BytesIO()
        torch.save(argparse.Namespace(lr=0.1), buf)
        def load():
            buf.seek(0)
            return torch.load(buf, weights_only=True)
        import gigatron.core, gigatron.core.safe_globals
        try:
            load()
        except pickle.UnpicklingError:
            pass
        else:
            raise AssertionError("gigatron.core's import should not touch torch's allowlist")
        import gigatron.compat.megatron as alias
        alias.install()
        import megatron.core
        assert load().lr == 0.1
        print("ok")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
