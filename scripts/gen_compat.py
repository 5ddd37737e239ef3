"""Generate docs/compat.md: Megatron Core's public names and their status in gigatron.

Run with megatron-core installed (`pip install megatron-core==0.16.1`, CPU is enough):

    python scripts/gen_compat.py > docs/compat.md

For every public class / function defined in the listed `megatron.core` modules, and every
field of `ModelParallelConfig` / `TransformerConfig`, the table says whether gigatron has it at the
same path: **supported** (same name, every Megatron parameter accepted), **partial** (exists,
some parameters missing; they are listed), **default only** (a config field accepted only at its
default value, with a clear error otherwise), or **not supported**. The test
`tests/unit/test_compat_table.py` checks every supported row against the code.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import warnings

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
        rejected, restricted = set(), {}
        for module_name in (
            "gigatron.core.model_parallel_config",
            "gigatron.core.transformer._config_checks",
            "gigatron.core.transformer.transformer_config",
        ):
            try:
                module = importlib.import_module(module_name)
            except Exception:
                continue
            for attr in ("_UNSUPPORTED_FIELDS", "UNSUPPORTED_FIELDS", "_UNSUPPORTED"):
                rejected |= set(getattr(module, attr, {}) or {})
            restricted.update(getattr(module, "_RESTRICTED_FIELDS", {}) or {})
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


def main() -> None:
    warnings.simplefilter("ignore")
    import megatron.core

    rows = list(api_rows()) + list(config_rows())
    counts = {}
    for _, _, status, _ in rows:
        counts[status] = counts.get(status, 0) + 1
    print("# Megatron Core API coverage\n")
    print(
        "Generated by `scripts/gen_compat.py` against megatron-core "
        f"{megatron.core.__version__}; checked by `tests/unit/test_compat_table.py` (every "
        "*supported* row imports from gigatron at the mirrored path, `megatron.` -> "
        "`gigatron.`, and accepts every listed parameter).\n"
    )
    print("Summary: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + ".\n")
    by_module: dict[str, dict[str, int]] = {}
    for path, kind, status, _ in rows:
        module = path.rsplit(".", 2 if kind == "field" else 1)[0]
        by_module.setdefault(module, {}).setdefault(status, 0)
        by_module[module][status] += 1
    print("| module | supported | partial | default only | not supported |")
    print("|---|---|---|---|---|")
    for module, c in by_module.items():
        cells = [
            str(c.get(k, 0)) for k in ("supported", "partial", "default only", "not supported")
        ]
        print(f"| `{module}` | " + " | ".join(cells) + " |")
    print()
    print("| Megatron name | kind | status | parameters |")
    print("|---|---|---|---|")
    for path, kind, status, params in rows:
        print(f"| `{path}` | {kind} | {status} | {params} |")


if __name__ == "__main__":
    main()
