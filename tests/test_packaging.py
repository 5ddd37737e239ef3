"""What `make setup` / `make train` put in the user's environment, and `make help`."""

import re
import shutil
import subprocess
import tomllib

import pytest

from tests._paths import REPO, put_oracle_first


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _requirement_names(lines) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", line.strip(), maxsplit=1)[0].lower() for line in lines}


def test_no_extra_installs_megatron_core():
    project = _pyproject()["project"]
    groups = {"dependencies": project["dependencies"], **project["optional-dependencies"]}
    for group, reqs in groups.items():
        assert "megatron-core" not in _requirement_names(reqs), group
    dev = [ln for ln in (REPO / "requirements-dev.txt").read_text().splitlines()]
    assert "megatron-core" not in _requirement_names(ln for ln in dev if ln and ln[0] != "#")


def _recipe(target: str) -> str:
    """The Makefile lines of `target` and of the targets it depends on, transitively."""
    text = (
        (REPO / "Makefile").read_text().replace("$(VENV)", ".venv").replace("$(BIN)", ".venv/bin")
    )
    rule = re.compile(r"^([^\s:#][^:=]*):(?!=)([^\n]*)\n((?:\t[^\n]*\n)*)", re.M)
    rules = {name: (deps, body) for name, deps, body in rule.findall(text)}
    seen, todo, out = set(), [target], []
    while todo:
        name = todo.pop()
        if name in seen or name not in rules:
            continue
        seen.add(name)
        deps, body = rules[name]
        out.append(body)
        todo += deps.split("##")[0].split()
    return "\n".join(out)


@pytest.mark.parametrize("target", ["setup", "train"])
def test_setup_and_train_leave_megatron_core_out(target):
    recipe = _recipe(target)
    assert "pip install" in recipe
    installs = [ln for ln in recipe.splitlines() if "uninstall" not in ln and "pip show" not in ln]
    installs = [ln for ln in installs if "echo" not in ln and "rmdir" not in ln]
    installs = [ln for ln in installs if not ln.lstrip("\t@ ").startswith("#")]
    assert not [ln for ln in installs if "oracle" in ln.lower() or "megatron" in ln], recipe


def test_setup_removes_megatron_core_an_older_setup_installed():
    recipe = _recipe("setup")
    assert "pip show -q megatron-core" in recipe, recipe
    assert "pip uninstall -y -q megatron-core" in recipe, recipe
    assert "echo" in recipe  # one line saying so
    assert "rmdir" in recipe  # and the empty megatron/ pip may leave behind


def test_oracle_goes_ahead_of_site_packages(tmp_path):
    paths = ["/repo", "/venv/lib/python3.11/site-packages", str(tmp_path)]
    put_oracle_first(paths, tmp_path)
    assert paths == [str(tmp_path), "/repo", "/venv/lib/python3.11/site-packages"]


def test_test_target_installs_the_oracle_apart():
    recipe = _recipe("test")
    assert "--target $(ORACLE)" in recipe and "MEGATRON_ORACLE=$(ORACLE)" in recipe
    assert "megatron-core==0.16.1" in (REPO / "requirements-oracle.txt").read_text()


def test_test_target_runs_two_xdist_workers_that_setup_installs():
    """`make test` spreads the suite over the CI machine's 2 cores (pytest-xdist, one file per
    worker); the package is in both install lists `make setup` reads."""
    text = (REPO / "Makefile").read_text()
    assert re.search(r"^PYTEST_WORKERS \?= 2$", text, re.M)
    assert "-n $(PYTEST_WORKERS) --dist loadfile" in _recipe("test")
    dev = (REPO / "requirements-dev.txt").read_text().splitlines()
    assert "pytest-xdist" in _requirement_names(ln for ln in dev if ln and ln[0] != "#")
    assert "pytest-xdist" in _requirement_names(
        _pyproject()["project"]["optional-dependencies"]["test"]
    )


def test_license_is_an_spdx_string():
    data = _pyproject()
    assert data["project"]["license"] == "Apache-2.0"
    floor = re.search(r"setuptools>=(\d+)", " ".join(data["build-system"]["requires"]))
    assert floor and int(floor.group(1)) >= 77  # the first setuptools reading SPDX strings


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_help_lists_every_target():
    r = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    phony = re.search(r"^\.PHONY:(.*)$", (REPO / "Makefile").read_text(), re.M).group(1).split()
    listed = re.findall(r"^\s+make (\S+)\s+\S", r.stdout, re.M)
    assert sorted(listed) == sorted(phony), r.stdout
