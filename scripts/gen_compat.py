"""Generate docs/compat.md from `gigatron.compat` and megatron-core's public names.

    python scripts/gen_compat.py            # writes docs/compat.md
    python scripts/gen_compat.py --check    # exit 1 when docs/compat.md is out of date
    python scripts/gen_compat.py --megatron-source /tmp/Megatron-LM   # table of a source tree

The first sections come from the compat package alone: Megatron-only config fields, names tutorials
use that Megatron never had, misuse errors, Megatron-LM flags gigatron accepts as no-ops or refuses.
The API coverage table needs megatron-core (`make oracle`, `PYTHONPATH=.venv-oracle`; CPU is
enough): for every public class / function defined in the listed `megatron.core` modules, and every
field of `ModelParallelConfig` / `TransformerConfig`, it says whether gigatron has it at the same
path: **supported** (same name, every Megatron parameter accepted), **partial** (exists, some
parameters missing; they are listed), **default only** (a config field accepted only at its default
value, with a clear error otherwise), or **not supported**. Without megatron-core (or with another
version than the committed table's) the committed table is kept as it is.

The committed table is of megatron-core 0.20 (no wheel yet): made from a Megatron-LM checkout with
`--megatron-source DIR`, which imports `DIR/megatron/core` ahead of any installed megatron-core
(its modules need `triton` importable: `pip install triton`, CPU is enough). With the installed
0.16.1 (the `test` extra) or 0.19.2 the generator regenerates only a table of that version.
`tests/compat/test_doc_is_current.py` fails when the doc is out of date;
`tests/compat/test_doc_table_holds.py` checks every supported row against the code.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import os
import re
import sys
import warnings
from pathlib import Path

from gigatron.compat import loss_reports, missing_names
from gigatron.compat import megatron_only_fields as mof
from gigatron.training import compat_flags as training_args

DOC = Path(__file__).resolve().parents[1] / "docs" / "compat.md"
API_HEADING = "## Megatron Core API coverage"
_VERSION = re.compile(r"against megatron-core (\S+?);")

MODULES = [
    "megatron.core.parallel_state",
    "megatron.core.process_groups_config",
    "megatron.core.tensor_parallel",
    "megatron.core.tensor_parallel.random",
    "megatron.core.tensor_parallel.utils",
    "megatron.core.pipeline_parallel",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.distributed",
    "megatron.core.distributed.finalize_model_grads",
    "megatron.core.optimizer",
    "megatron.core.optimizer.optimizer_config",
    "megatron.core.optimizer_param_scheduler",
    "megatron.core.num_microbatches_calculator",
    "megatron.core.dist_checkpointing",
    "megatron.core.dist_checkpointing.mapping",
    "megatron.core.dist_checkpointing.serialization",
    "megatron.core.dist_checkpointing.strategies.torch",
    "megatron.core.dist_checkpointing.dict_utils",
    "megatron.core.dist_checkpointing.utils",
    "megatron.core.dist_checkpointing.validation",
    "megatron.core.datasets.indexed_dataset",
    "megatron.core.datasets.gpt_dataset",
    "megatron.core.datasets.blended_dataset",
    "megatron.core.datasets.blended_megatron_dataset_builder",
    "megatron.core.datasets.blended_megatron_dataset_config",
    "megatron.core.transformer",
    "megatron.core.transformer.spec_utils",
    "megatron.core.transformer.transformer_layer",
    "megatron.core.transformer.transformer_block",
    "megatron.core.transformer.attention",
    "megatron.core.transformer.dot_product_attention",
    "megatron.core.packed_seq_params",
    "megatron.core.transformer.mlp",
    "megatron.core.transformer.enums",
    "megatron.core.transformer.moe.moe_layer",
    "megatron.core.transformer.moe.router",
    "megatron.core.transformer.moe.experts",
    "megatron.core.transformer.moe.token_dispatcher",
    "megatron.core.models.gpt",
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.models.common.embeddings.rotary_pos_embedding",
    "megatron.core.models.common.embeddings.language_model_embedding",
    "megatron.core.models.bert.bert_model",
    "megatron.core.models.T5.t5_model",
    "megatron.core.utils",
    "megatron.core.hyper_comm_grid",
    "megatron.core.rerun_state_machine",
    "megatron.core.transformer.torch_norm",
    "megatron.core.inference.sampling_params",
    "megatron.core.inference.inference_request",
    "megatron.core.inference.config",
    "megatron.core.inference.utils",
    "megatron.core.tokenizers.text",
]
CONFIGS = [
    "megatron.core.model_parallel_config.ModelParallelConfig",
    "megatron.core.transformer.transformer_config.TransformerConfig",
]


def _gigatron_path(megatron_path: str) -> str:
    return "gigatron" + megatron_path[len("megatron") :]


def _params(obj) -> list[str] | None:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    return [
        p.name
        for p in sig.parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def _accepts_kwargs(obj) -> bool:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        return any(p.kind == p.VAR_KEYWORD for p in inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return False


def _resolve(path: str):
    module_name, _, name = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, name, None)
    except Exception:  # modules may raise a helpful ImportError for names they lack
        return None


def api_rows():
    seen = set()
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except Exception:
            continue
        for name in sorted(dir(module)):
            if name.startswith("_"):
                continue
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if not getattr(obj, "__module__", "").startswith("megatron.core"):
                continue
            path = f"{module_name}.{name}"
            if path in seen:
                continue
            seen.add(path)
            kind = "class" if inspect.isclass(obj) else "function"
            ours = _resolve(_gigatron_path(path))
            if ours is None:
                yield path, kind, "not supported", ""
                continue
            theirs_p = _params(obj) or []
            ours_p = _params(ours)
            if ours_p is None:
                yield path, kind, "supported", ""
                continue
            missing = [p for p in theirs_p if p not in ours_p]
            if missing and not _accepts_kwargs(ours):
                yield path, kind, "partial", "missing: " + ", ".join(missing)
            else:
                yield path, kind, "supported", ", ".join(theirs_p)


def config_rows():
    for path in CONFIGS:
        theirs = _resolve(path)
        ours = _resolve(_gigatron_path(path))
        if theirs is None:
            continue
        our_fields = {f.name for f in dataclasses.fields(ours)} if ours else set()
        rejected = {
            *mof.PARALLEL,
            *mof.TRANSFORMER,
            *mof.DECLARED_PARALLEL,
            *mof.DECLARED_TRANSFORMER,
        }
        restricted = mof.RESTRICTED
        cls_name = path.rpartition(".")[2]
        for f in dataclasses.fields(theirs):
            if f.name.startswith("_"):
                continue
            row = f"{path.rpartition('.')[0]}.{cls_name}.{f.name}"
            if f.name not in our_fields:
                yield row, "field", "not supported", ""
            elif f.name in rejected:
                yield row, "field", "default only", ""
            elif f.name in restricted:
                yield row, "field", "partial", "values: " + restricted[f.name]
            else:
                yield row, "field", "supported", ""


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|")


def compat_lines() -> list[str]:
    """The sections generated from `gigatron.compat` alone."""
    out = ["# Megatron compatibility", ""]
    out += [
        "Generated by `scripts/gen_compat.py` from `gigatron.compat` (the package that holds every "
        "Megatron compatibility rule) and megatron-core's public names; "
        "`tests/compat/test_doc_is_current.py` fails when this page is out of date.",
        "",
        "- [Megatron-only config fields](#megatron-only-config-fields)",
        "- [Tutorial mistakes](#tutorial-mistakes)",
        "- [Megatron-LM flags](#megatron-lm-flags)",
        "- [Megatron Core API coverage](#megatron-core-api-coverage)",
        "",
        "## Megatron-only config fields",
        "",
        "Megatron fields for features gigatron does not implement construct at Megatron's default "
        "and raise ValueError naming the field, its value and why at any other value "
        "(`gigatron.compat.megatron_only_fields`).",
        "",
    ]
    tables = [
        ("ModelParallelConfig", mof.PARALLEL, mof.DECLARED_PARALLEL),
        ("TransformerConfig", mof.TRANSFORMER, mof.DECLARED_TRANSFORMER),
        ("OptimizerConfig", mof.OPTIMIZER, {}),
    ]
    for cls_name, table, declared in tables:
        out += [f"### {cls_name}", "", "| field | Megatron default | why gigatron refuses others |"]
        out += ["|---|---|---|"]
        rows = {name: (repr(default), why) for name, (default, why) in table.items()}
        rows.update({name: ("the config's", why) for name, why in declared.items()})
        for name in sorted(rows):
            default, why = rows[name]
            older = mof.OLDER_DEFAULTS.get(name)
            if older:
                default += " (older releases: " + ", ".join(map(repr, older)) + ")"
            out.append(f"| `{name}` | `{_cell(default)}` | {_cell(why)} |")
        out.append("")
    out += ["Accepted with some of Megatron's values only:", "", "| field | values |", "|---|---|"]
    out += [f"| `{name}` | {_cell(values)} |" for name, values in mof.RESTRICTED.items()]
    out += [""]
    out += _TUTORIAL_INTRO
    out += ["| tutorial's field | use instead |", "|---|---|"]
    out += [f"| `{k}` | {_cell(v)} |" for k, v in missing_names.NOT_MEGATRON_FIELDS.items()]
    out += ["", "| tutorial's class | use instead |", "|---|---|"]
    out += [f"| `{k}` | {_cell(v)} |" for k, v in missing_names.NOT_IN_MEGATRON.items()]
    out += [""] + _MISUSE
    methods = ", ".join(f"`{m}`" for m in loss_reports.TENSOR_METHODS)
    out += [line.replace("{methods}", methods) for line in _LOSS_REPORTS]
    out += _FLAGS_INTRO + ["| flag | why it changes nothing |", "|---|---|"]
    out += [f"| `{flag}` | {_cell(why)} |" for flag, why in training_args.NO_OPS.items()]
    out += ["", "Refused `--ckpt-format` values:", "", "| value | why |", "|---|---|"]
    out += [f"| `{k}` | {_cell(v)} |" for k, v in training_args.REFUSED_CKPT_FORMATS.items()]
    tokenizers = ", ".join(f"`{t}`" for t in training_args.TOKENIZER_TYPES)
    out += ["", f"`--tokenizer-type` accepts {tokenizers}; any other value is refused.", ""]
    return out


_TUTORIAL_INTRO = [
    "## Tutorial mistakes",
    "",
    "Blog posts and generated tutorials often use Megatron names that never existed, or use the "
    "schedule's return value like a loss tensor. gigatron turns these into errors that say what "
    "to use (`gigatron.compat.missing_names`, `gigatron.compat.loss_reports`; tested in "
    "`tests/compat/test_misuse_errors.py` and `tests/compat/test_moe_missing_names.py`).",
    "",
    "Config fields: `TransformerConfig(moe_expert_parallel_size=4)` raises `TypeError: "
    "TransformerConfig has no field 'moe_expert_parallel_size' (it is not a Megatron field "
    "either); use expert_model_parallel_size ...`. Any other unknown field gets the closest valid "
    "one (`did you mean ...?`); several unknown fields in one call give one TypeError, "
    "`TransformerConfig got N unknown fields:` then a line each. A test checks that every name "
    "below is absent from both gigatron's and megatron-core's `TransformerConfig` and that every "
    "suggestion is a real field of both.",
    "",
]

_MISUSE = [
    "Class names: `from gigatron.core.transformer.moe import MoEMLP` (also `.mlp`, `.moe.experts`, "
    "`.moe.moe_layer`, and through the `megatron.core` alias) raises an ImportError naming the "
    "class above; `moe.MoEMLP` an AttributeError with the same hint, and `hasattr` stays False.",
    "",
    "| mistake | error | use instead |",
    "|---|---|---|",
    "| `TransformerLayer(config)`, `TransformerLayer(config, None)` or `TransformerLayer(config, "
    "get_gpt_layer_local_spec())` | `TypeError: TransformerLayer needs "
    "submodules=TransformerLayerSubmodules ...` | `spec = get_gpt_layer_local_spec()`; "
    "`TransformerLayer(config, spec.submodules)` or `build_module(spec, config=config)` |",
    "| `scaler.scale(losses).backward()` / `losses.backward()` on what "
    "`get_forward_backward_func()(...)` returned | `TypeError: backward() called on the schedule's "
    "list of loss reports: the schedule already ran backward ...` | the Megatron optimizer's loss "
    "scaling (below) |",
    "| `losses_reduced / accumulation_steps` | `TypeError: ... gradient accumulation is the "
    "schedule's num_microbatches ...` | `num_microbatches=accumulation_steps`; average the "
    "reports |",
    "| `torch.cuda.set_device`, `.cuda()`, nccl, `torch.cuda.device_count()` as world size, run "
    "through `python -m gigatron.compat.megatron` without CUDA | when the traceback shows a CUDA "
    "call of the script failed, the launcher adds a RuntimeError naming the line it stopped at, "
    "all of the script's CUDA lines and the CPU path (an error that only mentions CUDA passes "
    'through unchanged) | gloo, `int(os.environ["WORLD_SIZE"])`, CPU tensors, '
    "`use_cpu_initialization=True` |",
    "| a model with dropout run without `model_parallel_cuda_manual_seed` (taken for a GPU-only "
    "call) | `ValueError: cuda rng state model-parallel-rng is not added: call tensor_parallel."
    "model_parallel_cuda_manual_seed(seed) ...` | call it after `initialize_model_parallel`, "
    "before building the model, on CPU too |",
    "| `import megatron.core` in plain `python` / `torchrun` (no launcher) | `ModuleNotFoundError: "
    "No module named 'megatron'` (gigatron ships no top-level `megatron` package) | "
    "`python -m gigatron.compat.megatron script.py` (also `-m MODULE`, `-c CODE`), "
    "`torchrun ... -m gigatron.compat.megatron script.py`, or `gigatron.core` imports |",
    "",
    "Mistakes in how a hand-built program sets up parallelism (config sizes that are not "
    "`parallel_state`'s, `pre_process` / `post_process` on every stage, a dense spec with experts, "
    "differing replicas at save, BERT corpora without sentences) are listed in "
    "[learn.md](learn.md).",
    "",
]

_LOSS_REPORTS = [
    "### GradScaler and the schedule's losses",
    "",
    "The schedules return (as in Megatron) a list with one entry per microbatch: whatever "
    '`loss_func` reported, e.g. `[{"lm loss": tensor}, ...]`, on the last pipeline stage and `[]` '
    "elsewhere. Backward has **already** run inside the schedule, so there is nothing left for a "
    "`GradScaler` to scale. gigatron returns a `list` subclass (`LossReports`, equal to and used "
    "like a plain list) whose tensor methods ({methods}) raise the TypeError above. "
    "`torch.amp.GradScaler.scale(list)` rebuilds the same type, so "
    "`scaler.scale(losses).backward()` reaches that error whether the scaler is enabled or not "
    "(`torch.cuda.amp.GradScaler` on a CPU machine is disabled and returns the list itself).",
    "",
    "What to use instead, the Megatron way:",
    "",
    "<!-- fragment: ddp_model and forward_backward_func come from your training script -->",
    "```python",
    "from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer",
    "",
    "optimizer = get_megatron_optimizer(",
    '    OptimizerConfig(optimizer="adam", lr=1e-4, fp16=True, loss_scale=None,  # None: dynamic',
    "                    initial_loss_scale=2**16),",
    "    [ddp_model],",
    ")",
    "# As megatron.training does: the schedule multiplies each microbatch's loss by the current",
    "# scale (through config.grad_scale_func) before its backward.",
    "ddp_model.config.grad_scale_func = optimizer.scale_loss",
    "losses = forward_backward_func(forward_step_func=..., data_iterator=..., model=ddp_model,",
    "                               num_microbatches=4, seq_length=32, micro_batch_size=2)",
    "update_successful, grad_norm, num_zeros = optimizer.step()  # unscale, skip on inf/nan",
    'lm_loss = sum(d["lm loss"] for d in losses) / len(losses)',
    "```",
    "",
    "For a custom scaler set `model.config.grad_scale_func = lambda loss: loss * my_scale` "
    "yourself and unscale the `main_grad`s before stepping. bf16 needs no loss scaling "
    "(`OptimizerConfig(bf16=True)`); see `examples/mixed_precision_grad_accum.py`.",
    "",
    "Where gigatron differs from Megatron: Megatron returns a plain `list`, so the same mistakes "
    "give `AttributeError: 'list' object has no attribute 'backward'` or an unknown-keyword "
    "TypeError without a suggestion. Nothing else changes: `isinstance(losses, list)`, indexing, "
    "iteration and equality behave as for a list.",
    "",
]

_FLAGS_INTRO = [
    "## Megatron-LM flags",
    "",
    "`gigatron.training.compat_flags` adds the flags Megatron-LM's example scripts pass: some with "
    "their real semantics (docs/training.md), these as accepted no-ops, and values gigatron cannot "
    "honour refused with a ValueError naming the flag.",
    "",
]


def api_lines() -> list[str]:
    """The API coverage section, generated from the installed megatron-core."""
    warnings.simplefilter("ignore")
    import megatron.core

    rows = list(api_rows()) + list(config_rows())
    counts: dict[str, int] = {}
    for _, _, status, _ in rows:
        counts[status] = counts.get(status, 0) + 1
    out = [
        API_HEADING,
        "",
        f"Generated against megatron-core {megatron.core.__version__}; checked by "
        "`tests/compat/test_doc_table_holds.py` (every *supported* row imports from gigatron at "
        "the mirrored path, `megatron.` -> `gigatron.`, and accepts every listed parameter).",
        "",
        "Summary: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + ".",
        "",
    ]
    by_module: dict[str, dict[str, int]] = {}
    for path, kind, status, _ in rows:
        module = path.rsplit(".", 2 if kind == "field" else 1)[0]
        by_module.setdefault(module, {}).setdefault(status, 0)
        by_module[module][status] += 1
    out += ["| module | supported | partial | default only | not supported |"]
    out += ["|---|---|---|---|---|"]
    for module, c in by_module.items():
        cells = [
            str(c.get(k, 0)) for k in ("supported", "partial", "default only", "not supported")
        ]
        out.append(f"| `{module}` | " + " | ".join(cells) + " |")
    out += ["", "| Megatron name | kind | status | parameters |", "|---|---|---|---|"]
    out += [f"| `{path}` | {kind} | {status} | {params} |" for path, kind, status, params in rows]
    return out


def committed_api_lines(text: str) -> list[str] | None:
    """The API coverage section of a committed docs/compat.md, or None if it has none."""
    if API_HEADING not in text:
        return None
    return text[text.index(API_HEADING) :].rstrip("\n").split("\n")


def _use_megatron_source(root: str) -> None:
    """Import `root/megatron/core` ahead of any installed megatron-core."""
    if not (Path(root) / "megatron" / "core").is_dir():
        raise SystemExit(f"gen_compat: no megatron/core under {root}")
    os.environ["NO_VCS_VERSION"] = "1"  # Megatron's package_info would run git otherwise
    sys.path.insert(0, str(Path(root).resolve()))


def _installed_megatron() -> str | None:
    if any((Path(p) / "megatron" / "core" / "package_info.py").is_file() for p in sys.path[:1]):
        from megatron.core.package_info import __version__  # a --megatron-source tree

        return __version__
    try:
        from importlib.metadata import version

        return version("megatron-core")
    except Exception:
        return None


def render(committed: str = "", force: bool = False) -> str:
    """The whole page; the API section regenerated when megatron-core of the committed table's
    version (or any, when there is no committed table; any with `force`) is installed, else
    kept."""
    kept = committed_api_lines(committed)
    wanted = _VERSION.search(committed)
    installed = _installed_megatron()
    if installed and (force or kept is None or wanted is None or wanted.group(1) == installed):
        api = api_lines()
    elif kept is not None:
        api = kept
    else:
        raise SystemExit("gen_compat: no committed API table and megatron-core is not installed")
    return "\n".join(compat_lines() + api) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/compat.md is stale")
    parser.add_argument("--megatron-source", help="a Megatron-LM checkout to take the table from")
    args = parser.parse_args(argv)
    if args.megatron_source:
        _use_megatron_source(args.megatron_source)
    committed = DOC.read_text() if DOC.exists() else ""
    text = render(committed, force=bool(args.megatron_source))
    if args.check:
        if text != committed:
            print(f"{DOC} is out of date: run python scripts/gen_compat.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
