"""The MoE targets of issue 34 from a results.jsonl written by `bash bench/run.sh moe`.

    python bench/moe/compare_moe.py results.jsonl

Prints one `MOE {json}` line: per config the gigatron fast-path row (ms / step, tokens/s,
TFLOP/s by active parameters, MFU, host syncs in one step), the anchors of the same call
(megatron-core 0.19.2 local SequentialMLP, plain PyTorch eager and compiled), the ratios, and
the targets with pass / fail: mixtral-8l >= 2x megatron-core, >= 1.0x the best PyTorch anchor,
MFU >= 45%; deepseek-fg MFU >= 35%; zero host syncs. All rows time forward + backward of one
micro-batch (gigatron: `--optimizer none`). The torch anchor's fine-grained variant (target
`moe-fg-anchor`) has no shared experts, so it is compared by TFLOP/s of its own model.
"""

from __future__ import annotations

import json
import os
import sys

# the repo root: gigatron and bench.* import without an install
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from gigatron.training.flops import flops_per_token  # noqa: E402

PEAK = 989e12
# anchor shapes (bench/anchors/torch_moe_bench.py; its fine-grained variant from run.sh)
_ANCHOR_SHAPES = {
    "moe-8x-h200": dict(kv=8, f=4096, e=8, k=2, shared=None),
    "deepseek-fg-no-shared": dict(kv=16, f=1024, e=64, k=8, shared=None),
}
_GIGATRON_CONFIG = {"moe-8x-h200": "mixtral-8l", "deepseek-fg-no-shared": "deepseek-fg"}


def _anchor_tflops(row: dict) -> float | None:
    shape = _ANCHOR_SHAPES.get(row.get("config"))
    if shape is None or not row.get("tokens_per_s"):
        return None
    per_token = flops_per_token(
        num_layers=8,
        hidden_size=2048,
        seq_length=2048,
        vocab_size=50304,
        num_attention_heads=16,
        num_query_groups=shape["kv"],
        gated_linear_unit=True,
        num_experts=shape["e"],
        moe_router_topk=shape["k"],
        moe_ffn_hidden_size=shape["f"],
        moe_shared_expert_intermediate_size=shape["shared"],
    )
    return round(per_token * row["tokens_per_s"] / 1e12, 1)


def summary(rows: list[dict]) -> dict:
    out: dict = {}
    for config in ("mixtral-8l", "deepseek-fg"):
        mine = [
            r
            for r in rows
            if r.get("config") == config and str(r.get("impl", "")).startswith("gigatron")
        ]
        if not mine:
            continue
        best = max(mine, key=lambda r: r["tokens_per_s"])
        entry = {
            "gigatron": {
                k: best.get(k)
                for k in ("impl", "ms_per_step", "tokens_per_s", "tflops_per_gpu", "mfu")
            }
            | {"host_sync_count": best.get("host_sync_count"), "step": best.get("step")},
            "gigatron_runs": {r["impl"]: r["tokens_per_s"] for r in mine},
            "anchors": {},
        }
        for r in rows:
            anchor_config = r.get("config")
            if _GIGATRON_CONFIG.get(anchor_config) != config or "tokens_per_s" not in r:
                continue
            entry["anchors"][r["impl"]] = {
                "ms_per_step": r.get("ms_per_step"),
                "tokens_per_s": r["tokens_per_s"],
                "tflops": _anchor_tflops(r),
                "gigatron_ratio_tokens": round(best["tokens_per_s"] / r["tokens_per_s"], 3),
                "gigatron_ratio_tflops": round(best["tflops_per_gpu"] / _anchor_tflops(r), 3),
            }
        out[config] = entry
    out["targets"] = _targets(out)
    return out


def _targets(out: dict) -> dict:
    targets = {}
    mix = out.get("mixtral-8l")
    if mix:
        anchors = mix["anchors"]
        mega = [v for k, v in anchors.items() if k.startswith("megatron-core")]
        torch_rows = [v for k, v in anchors.items() if k.startswith("torch-moe")]
        if mega:
            targets["mixtral >= 2x megatron-core"] = mega[-1]["gigatron_ratio_tokens"] >= 2.0
        if torch_rows:
            worst = min(v["gigatron_ratio_tokens"] for v in torch_rows)
            targets["mixtral >= 1.0x plain PyTorch (best)"] = worst >= 1.0
        targets["mixtral MFU >= 45%"] = mix["gigatron"]["mfu"] >= 0.45
    fg = out.get("deepseek-fg")
    if fg:
        targets["deepseek-fg MFU >= 35%"] = fg["gigatron"]["mfu"] >= 0.35
    configs = [c for c in ("mixtral-8l", "deepseek-fg") if c in out]
    syncs = [out[c]["gigatron"]["host_sync_count"] for c in configs]
    if syncs and all(s is not None for s in syncs):
        targets["zero host syncs per step"] = all(s == 0 for s in syncs)
    return targets


def main(paths: list[str]) -> None:
    rows = []
    for path in paths:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if "failed" not in r and "skipped" not in r]
    print("MOE", json.dumps(summary(rows)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
