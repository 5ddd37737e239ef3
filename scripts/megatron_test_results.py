"""Which Megatron-LM test files run on CPU, how their results are classified, and the report.

Used by scripts/run_megatron_unit_tests.py (`--nproc ... --report`). Every rule is here, as
data, so the report is reproducible from a checkout: no hand-kept list of files.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections import Counter, defaultdict
from pathlib import Path

# A test file that imports one of these at module level, outside `try`, cannot import on CPU.
CUDA_ONLY_PACKAGES = (
    "transformer_engine", "apex", "flash_attn", "flash_attn_interface", "flashinfer", "flash_mla",
    "deep_ep", "nvshmem", "cupy", "mamba_ssm", "causal_conv1d", "nvidia_modelopt", "modelopt",
    "megatron.core.extensions.transformer_engine",
)  # fmt: skip

# Megatron's CI runs from /opt/megatron-lm with data sets in /opt/data, and fetches from the hub
CI_LAYOUT = (
    r"/opt/megatron-lm|/opt/data\b|huggingface\.co|Max retries exceeded|LocalEntryNotFoundError|"
    r"Temporary failure in name resolution|Network is unreachable|OfflineModeIsEnabled|"
    r"couldn't connect to"
)
# First match wins; each pattern is searched in the exception line, then in the whole message.
SKIP_RULES = (
    # "Spec function is not supported": the TE op-fuser layer spec, None without TE >= 1.13
    ("needs Transformer Engine", r"transformer.?engine|\bTE\b|\bte\b|Spec function is not supp"),
    ("needs CUDA", r"cuda|gpu|nccl|nvidia|blackwell|hopper|ampere|fp8|mxfp|nvfp4|device"),
    ("needs more ranks", r"world.?size|ranks?\b|processes|at least \d|\* PP \(\d+\) > \d"),
    ("process group did not form", r"wait timeout|Cannot initialize distributed"),
    ("runs its own launcher", r"spawns its own|own torchrun|as a plain process"),
    ("needs Megatron's CI data or network", CI_LAYOUT + r"|download|internet|path not avail"),
    (
        "optional package missing",
        r"not installed|could not import|requires?\b|No module named|avail",
    ),
    ("xfail", r"^xfail"),
    ("the test's own choice", r"^Skipping\b|^unconditional skip|was broken after"),
    ("gap: missing name", r"not importable"),
)
FAILURE_RULES = (
    ("needs Megatron's CI data or network", CI_LAYOUT),
    ("optional package missing", r"msc://"),  # multi-storage-client, left out on purpose
    ("needs Transformer Engine", r"transformer_engine|Transformer.?Engine|\bTE\b"),
    (
        "needs CUDA",
        r"Torch not compiled with CUDA|CUDA|\.cuda\b|cuda:|nccl|NCCL|No CUDA GPUs|"
        r"device_count|torch\._C\._cuda|NVIDIA driver|cudaGetDevice|'cuda'|triton",
    ),
    (
        "world size",
        r"world.?size|not divisible|divisible by|must be (?:less|greater)|"
        r"out of range for .*group|rank \d+ .* group",
    ),
    (
        "deliberate difference",
        r"StateError|ArgumentError|RerunMode|at Megatron's default|not in the target allowlist|"
        r"parallel_state was initialized with|requires pipeline_model_parallel_size > 1|"
        r"gigatron (?:refuses|raises|keeps|does not)|refused|not supported "
        r"by gigatron|gigatron implements",
    ),
    (
        "gap: missing name",
        r"has no attribute|cannot import name|No module named|does not have the attribute|"
        r"has no gigatron counterpart|not provided by gigatron",
    ),
    (
        "gap: signature",
        r"unexpected keyword argument|missing \d+ required|takes \d+ positional|"
        r"got multiple values",
    ),
    ("gap: not implemented", r"NotImplementedError|not implemented"),
    (  # a value Megatron accepts (hidden_size=0 in a config only carried around, ...)
        "gap: gigatron checks more",
        r"must be set to a positive value|requires use_distributed_optimizer|give --data-path|"
        r"window_attn_skip_freq \(.*\) must be",
    ),
    # the test mocks the torch.distributed calls Megatron makes; gigatron makes others
    ("gap: other torch.distributed calls", r"is not registered, please create group"),
    ("gap: error message", r"Regex pattern did not match"),
    ("gap: missing check (no raise or warning)", r"DID NOT (?:RAISE|WARN)"),
    ("gap: different result", r"^(?:AssertionError\b|assert\b)|^Failed: "),
)
# Past the exception line, only these unmistakable marks classify (tracebacks name CUDA often).
DEEP_RULES = (
    ("needs Transformer Engine", r"No module named 'transformer_engine|transformer_engine\."),
    ("needs CUDA", r"Torch not compiled with CUDA|No CUDA GPUs|torch\._C\._cuda|NVIDIA driver"),
    # test_imports.py names modules from the folder megatron.core lives in (gigatron/core here)
    ("needs Megatron's source layout", r"_test_domain_module_imports\(mcore"),
)
UNCLASSIFIED = "unclassified"
# Tests whose failure message cannot say why: (node id pattern, class, why, message pattern
# ("" for any)), checked first. Each is explained in docs/megatron_unit_tests.md ("Where
# gigatron differs").
KNOWN_TESTS = (
    (
        r"training/config/test_container_base\.py::TestConfigContainer_FromYaml::",
        "deliberate difference",
        "mocks builtins.open / yaml.safe_load / OmegaConf inside from_yaml; gigatron reads "
        "YAML through its bounded reader (core.untrusted_yaml)",
        "",
    ),
    (
        r"data/test_builder\.py::test_fast_builder\[",
        "deliberate difference",
        "at 4 and 8 ranks, after the refused fast_cache_load / defer_npy_index_mmap / "
        "sequences_per_dataset: the first rank to raise leaves the test, and Megatron's "
        "TempNamedDir (its finalizer, on any rank) deletes the shared directory the other ranks "
        "still read; their FileNotFoundError puts the file's collectives out of step",
        r"pair closure|Connection closed by peer|Timed out waiting \d+ms for (?:send|recv)|"
        r"^FileNotFoundError: .*test_fast_builder/",
    ),
    (
        r"data/test_builder\.py::test_builder$",
        "deliberate difference",
        "a split asked for 0 samples is None on every rank in gigatron (--eval-iters 0 with a "
        "blend); Megatron builds an empty BlendedDataset there when the blend has no weights",
        r"^AttributeError: 'NoneType' object has no attribute 'datasets'",
    ),
    (
        r"test_parallel_state\.py::test_different_initialize_order_unconsistency\[",
        "fails on Megatron too (marked flaky; its CI deselects it)",
        "order tp-pp-ep-dp with pp > 1 and expert data parallel size != data parallel size: "
        "Megatron's initialize_model_parallel asserts the same rule",
        r"does not end with 'pp'",
    ),
    (
        r"test_hyper_comm_grid\.py::TestHyperCommGridIntegration::"
        r"test_real_distributed_rank_enumeration_verification",
        "needs CUDA",
        "puts its tensor on cuda:{rank % torch.cuda.device_count()}; the count is 0 on CPU",
        r"^ZeroDivisionError: integer modulo by zero",
    ),
)

_MISSING = (
    re.compile(r"cannot import name '([\w.]+)' from '([\w.]+)'"),  # -> module.name
    re.compile(r"No module named '([\w.]+)'"),
    re.compile(r"^([\w.]+) has no gigatron counterpart"),
    re.compile(r"^([\w.]+) is not provided by gigatron"),
    re.compile(r"module '([\w.]+)' has no attribute '(\w+)'"),
)


def find_test_files(checkout: Path, paths: list[str]) -> list[str]:
    """The test_*.py files under `paths` (relative to the checkout), sorted."""
    found: set[str] = set()
    for p in paths:
        full = checkout / p
        if full.is_file():
            found.add(p)
        else:
            found.update(str(f.relative_to(checkout)) for f in full.rglob("test_*.py"))
    return sorted(found)


def cpu_blocker(source: str) -> str | None:
    """The CUDA-only package a test file imports at module level outside `try`, or None."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return f"syntax error: {err.msg}"
    for node in tree.body:  # module level only: `try` / `if` bodies are optional imports
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            for pkg in CUDA_ONLY_PACKAGES:
                if name == pkg or name.startswith(pkg + "."):
                    return pkg
    return None


def count_tests(source: str) -> int:
    """Test functions in a file (parametrisations count once): what an import error blocks."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return 0
    n = 0
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
            "test"
        ):
            n += 1
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            n += sum(
                isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) and f.name.startswith("test")
                for f in node.body
            )
    return n


def classify(message: str, rules=FAILURE_RULES, nodeid: str = "") -> str:
    """The class of a failure (or, with SKIP_RULES, a skip reason): a KNOWN_TESTS entry for a
    failed `nodeid`, else the first rule matching the exception line, else a DEEP_RULES match
    anywhere in the message, else unclassified."""
    if rules is FAILURE_RULES:
        for pattern, cls, _why, text in KNOWN_TESTS:
            if re.search(pattern, nodeid) and re.search(text, message.strip(), re.MULTILINE):
                return cls
    first = message.strip().splitlines()[0] if message.strip() else ""
    if rules is FAILURE_RULES and _layout_above_world(first):
        return "needs more ranks"
    flags = re.IGNORECASE if rules is SKIP_RULES else 0
    for name, pattern in rules:
        if re.search(pattern, first, flags=flags):
            return name
    for name, pattern in DEEP_RULES:
        if re.search(pattern, message):
            return name
    return UNCLASSIFIED


def _layout_above_world(line: str) -> bool:
    """A layout refused because it takes more ranks than the world has (it runs at a larger
    N): gigatron's "world size (W) is not divisible by ... size (S)" with S > W, or a
    HyperCommGrid "Grid shape [..] is over sized with world size W"."""
    m = re.search(r"world size \((\d+)\) is not divisible by .*size \((\d+)\)", line)
    if m:
        return int(m.group(2)) > int(m.group(1))
    m = re.search(r"Grid shape \[([\d, ]+)\] is over sized with world size (\d+)", line)
    if m:
        return math.prod(int(d) for d in m.group(1).split(",")) > int(m.group(2))
    return False


def blocker_class(name: str) -> str:
    """Who can remove a name that stops a file at import."""
    for pkg in CUDA_ONLY_PACKAGES:
        if name == pkg or name.startswith(pkg + "."):
            return "needs Transformer Engine" if "transformer_engine" in pkg else "needs CUDA"
    if name.startswith(("megatron.core", "megatron.training")):
        return "gap: missing name"
    if name.startswith("megatron."):
        return "outside megatron.core / megatron.training"
    return "third-party package missing"


def missing_name(message: str) -> str | None:
    """The name whose absence stopped an import, from the error text."""
    for line in reversed(message.strip().splitlines()):
        line = re.sub(r"^E\s+", "", line.strip())
        line = re.sub(r"^(?:\w+\.)*(?:ModuleNotFoundError|ImportError|AttributeError): ", "", line)
        for pattern in _MISSING:
            m = pattern.search(line)
            if m:
                name = ".".join(reversed(m.groups()) if pattern is _MISSING[0] else m.groups())
                return re.sub(r"^gigatron\.(core|training)\b", r"megatron.\1", name)
    return None


def directory(path: str) -> str:
    parts = Path(path).parts
    return parts[2] if len(parts) > 3 else "(top level)"


def first_line(text: str, width: int = 150) -> str:
    first = next((ln.strip() for ln in text.strip().splitlines() if ln.strip()), "")
    first = first.replace("|", "\\|")
    return first if len(first) <= width else first[: width - 1] + "…"


def render(meta: dict, results: dict[int, dict]) -> str:
    """The markdown report. `results[N]` holds `tests` (nodeid -> {outcome, message}),
    `import_errors` (file -> message), `stopped` (file -> 'timeout'/'crash'), `files`."""
    sizes = sorted(results)
    out = [
        "# Megatron-LM's unit tests on gigatron",
        "",
        f"Generated by `{meta['command']}` (docs/megatron_unit_tests.md). Do not edit by hand.",
        "",
        f"- Megatron-LM commit: `{meta['megatron_commit']}`",
        f"- gigatron commit: `{meta['gigatron_commit']}`",
        f"- world sizes run: {', '.join(map(str, sizes))} (gloo CPU ranks under torchrun, each "
        f"test directory one pytest session per world size, {meta['timeout']} s per file)",
        f"- test files: {meta['n_files']}; CPU-runnable by their imports: {meta['n_cpu']}; "
        f"the other {meta['n_files'] - meta['n_cpu']} import a CUDA-only package at module level "
        "(listed at the end)",
        "",
        *([meta["note"], ""] if meta.get("note") else []),
        "Results are rank 0's. A skip or failure that needs CUDA or Transformer Engine is never a "
        "pass. Files not importable: collection errors (their tests are not counted).",
        "",
        "## Summary",
        "",
        "| world size | passed | failed | skipped | files not importable | files stopped |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sizes:
        c = counts(results[n]["tests"].values())
        stopped = results[n]["stopped"]
        out.append(
            f"| {n} | {c['passed']} | {c['failed']} | {c['skipped']} | "
            f"{len(results[n]['import_errors'])} | {len(stopped)} |"
        )
    for n in sizes:
        out += ["", f"## Per directory, {n} rank{'s' if n > 1 else ''}", ""]
        out += ["| directory | files | passed | failed | skipped | not importable | stopped |"]
        out += ["|---|---:|---:|---:|---:|---:|---:|"]
        by_dir: dict[str, list] = defaultdict(list)
        for nodeid, t in results[n]["tests"].items():
            by_dir[directory(nodeid.split("::")[0])].append(t)
        files = Counter(directory(f) for f in results[n]["files"])
        bad = Counter(directory(f) for f in results[n]["import_errors"])
        stop = Counter(directory(f) for f in results[n]["stopped"])
        for d in sorted(files):
            c = counts(by_dir[d])
            out.append(
                f"| {d} | {files[d]} | {c['passed']} | {c['failed']} | {c['skipped']} | "
                f"{bad[d]} | {stop[d]} |"
            )
    out += _classes(results, sizes, "skipped", SKIP_RULES, "Skip reasons")
    out += _classes(results, sizes, "failed", FAILURE_RULES, "Failure causes")
    out += _blockers(meta, results, sizes)
    out += _stopped(results, sizes)
    out += _failures(results, sizes)
    out += ["", "## Files not CPU-runnable by their imports", ""]
    out += [f"- `{f}`: imports `{pkg}`" for f, pkg in sorted(meta["excluded"].items())]
    return "\n".join(out) + "\n"


def counts(tests) -> Counter:
    c = Counter(t["outcome"] for t in tests)
    return Counter(passed=c["passed"], failed=c["failed"], skipped=c["skipped"])


def _classes(results, sizes, outcome, rules, title) -> list[str]:
    rules_text = "; ".join(f"{name}: `{pattern}`" for name, pattern in rules)
    if rules is FAILURE_RULES:
        known = "; ".join(
            f"`{p}`{f' failing with `{t}`' if t else ''}: {cls} ({why})"
            for p, cls, why, t in KNOWN_TESTS
        )
        rules_text = (f"tests known by node id (checked first): {known}; needs more ranks: a "
                      "layout taking more ranks than the world size; " + rules_text)  # fmt: skip
    out = ["", f"## {title}", "", f"Classified by rules in scripts/megatron_test_results.py "
           f"(first match wins; {rules_text.replace('|', chr(92) + '|')})", ""]  # fmt: skip
    out += ["| class | " + " | ".join(f"N={n}" for n in sizes) + " | example |"]
    out += ["|---|" + "---:|" * len(sizes) + "---|"]
    per: dict[str, Counter] = defaultdict(Counter)
    example: dict[str, str] = {}
    for n in sizes:
        for nodeid, t in sorted(results[n]["tests"].items()):
            if t["outcome"] == outcome:
                cls = classify(t["message"], rules, nodeid)
                per[cls][n] += 1
                example.setdefault(
                    cls, f"{first_line(t['message'], 100)} ({nodeid.split('::')[0]})"
                )
    for cls in sorted(per, key=lambda k: -sum(per[k].values())):
        counts = " | ".join(str(per[cls][n]) for n in sizes)
        out.append(f"| {cls} | {counts} | {example[cls]} |")
    return out


def _blockers(meta, results, sizes) -> list[str]:
    files: dict[str, set] = defaultdict(set)
    for n in sizes:
        for f, msg in results[n]["import_errors"].items():
            files[missing_name(msg) or f"(other) {first_line(msg, 80)}"].add(f)
    out = ["", "## Names that stop files at import", ""]
    out += ["Missing names (module or module.attribute) behind collection errors, at any world "
            "size; tests blocked counts test functions in those files.", ""]  # fmt: skip
    out += ["| name | files | tests blocked | class |", "|---|---:|---:|---|"]
    rows = [
        (name, fs, sum(meta["test_counts"].get(f, 0) for f in fs)) for name, fs in files.items()
    ]
    for name, fs, tests in sorted(rows, key=lambda r: (-len(r[1]), -r[2], r[0])):
        cls = blocker_class(name) if not name.startswith("(other)") else classify(name[8:])
        out.append(f"| `{name}` | {len(fs)} | {tests} | {cls} |")
    return out


def _stopped(results, sizes) -> list[str]:
    out = ["", "## Files stopped (per-file timeout or a rank died)", ""]
    rows = [
        f"- N={n} `{f}`: {why}" for n in sizes for f, why in sorted(results[n]["stopped"].items())
    ]
    return out + (rows or ["None."])


def _failures(results, sizes) -> list[str]:
    fails: dict[str, dict] = defaultdict(dict)
    for n in sizes:
        for nodeid, t in results[n]["tests"].items():
            if t["outcome"] == "failed":
                fails[nodeid][n] = t["message"]
    by_class: dict[str, list] = defaultdict(list)
    for nodeid, per_n in sorted(fails.items()):
        msg = per_n[min(per_n)]
        by_class[classify(msg, nodeid=nodeid)].append((nodeid, sorted(per_n), msg))
    out = ["", "## Every failure, by cause class", ""]
    for cls in sorted(by_class, key=lambda k: (-len(by_class[k]), k)):
        out += [f"### {cls} ({len(by_class[cls])})", ""]
        for nodeid, ns, msg in by_class[cls]:
            out.append(f"- `{nodeid}` (N={','.join(map(str, ns))}): {first_line(msg)}")
        out.append("")
    return out


def load_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill
            pass
    return events
