"""Streaming HF import / export: seconds and peak host memory per rank, as JSON.

    python bench/convert/bench_streaming.py --config tiny                      # harness check
    python bench/convert/bench_streaming.py --config llama-1b --tp 2 --pp 2    # the 1B figures

A Llama-shaped HF checkpoint of the config with random weights is written to local disk
(`--dir`, default a temp directory; `--max-shard-bytes` per safetensors file, as HF shards;
untimed). Then `tp x pp` gloo ranks on CPU each build their model (weights not initialised) and
time three phases, sampling their memory (/proc/self/status VmRSS and RssAnon, every 5 ms):

- import: `load_hf_into_model` (each rank reads only its pieces);
- export: `AutoBridge.save_hf_weights` (every rank streams, rank 0 writes shards + index);
- export_ckpt: after the ranks save a torch_dist checkpoint (untimed), one fresh process (forked
  from run_distributed's server, gigatron imported) turns it into HF safetensors with
  `AutoBridge.export_ckpt` (no model built).

Per phase and rank: seconds, the RSS before, the peak during and the growth (peak - before), next
to the rank's model bytes, the largest HF tensor and the whole checkpoint; `verified`: the
exports hold bitwise the source tensors. One `RESULT {json}` line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time

import torch

# the repo root: gigatron and bench.* import without an install
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CONFIGS = {  # layers, hidden, heads, kv heads, ffn, vocab (llama-1b: Llama-3.2-1B's shape)
    "tiny": (4, 64, 4, 2, 128, 1000),
    "llama-1b": (16, 2048, 32, 8, 8192, 128256),
}
_MB = 1024**2


def _status() -> tuple[int, int]:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return tuple(int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "RssAnon"))


class _Peak:
    """Samples VmRSS / RssAnon in a thread while the block runs."""

    def __enter__(self):
        self.before = _status()
        self.peak = list(self.before)
        self._done = False
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        self.t0 = time.perf_counter()
        return self

    def _sample(self):
        while not self._done:
            self.peak = [max(p, s) for p, s in zip(self.peak, _status())]
            time.sleep(0.005)

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        self._done = True
        self._thread.join()
        self.peak = [max(p, s) for p, s in zip(self.peak, _status())]

    def report(self) -> dict:
        rss0, anon0 = self.before
        rss, anon = self.peak
        return dict(
            seconds=round(self.seconds, 3),
            rss_before_mb=round(rss0 / _MB, 1), rss_peak_mb=round(rss / _MB, 1),
            rss_growth_mb=round((rss - rss0) / _MB, 1),
            anon_growth_mb=round((anon - anon0) / _MB, 1),
        )  # fmt: skip


def hf_config(name: str, dtype: str) -> dict:
    layers, hidden, heads, kv, ffn, vocab = CONFIGS[name]
    return dict(
        model_type="llama", architectures=["LlamaForCausalLM"], num_hidden_layers=layers,
        hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv,
        intermediate_size=ffn, vocab_size=vocab, max_position_embeddings=2048,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False, torch_dtype=dtype,
    )  # fmt: skip


def write_checkpoint(path: str, cfg: dict, dtype: torch.dtype, max_shard_bytes: int) -> dict:
    """Random HF safetensors of `cfg`, streamed tensor by tensor; returns {name: shape}."""
    from gigatron.convert.hf_io import iter_planned, write_safetensors

    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (v, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "self_attn.q_proj.weight": (h, h),
            p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, h), p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
            p + "mlp.down_proj.weight": (h, f),
        })  # fmt: skip
    shapes.update({"model.norm.weight": (h,), "lm_head.weight": (v, h)})
    os.makedirs(path, exist_ok=True)
    plan = [(n, s, dtype) for n, s in shapes.items()]
    gen = torch.Generator().manual_seed(0)
    make = lambda n: (torch.randn(shapes[n], generator=gen) * 0.02).to(dtype)  # noqa: E731
    write_safetensors(path, plan, iter_planned(plan, make), max_shard_bytes=max_shard_bytes)
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    return shapes


def _rank(hf_dir, out_dir, ckpt_dir, tp, pp, dtype_name, max_shard_bytes):
    from gigatron.convert import load_hf_into_model, read_hf_config, spec_from_hf_config
    from gigatron.convert.bridge import AutoBridge
    from gigatron.convert.hf_io import HFReader
    from gigatron.core import dist_checkpointing
    from gigatron.core import parallel_state as ps

    dtype = getattr(torch, dtype_name)
    ps.initialize_model_parallel(tp, pp)
    spec = spec_from_hf_config(read_hf_config(hf_dir), tensor_model_parallel_size=tp)
    model = spec.build_model(
        pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, pipeline_dtype=dtype,
        params_dtype=dtype, perform_initialization=False,
    )  # fmt: skip
    held = sum(p.numel() * p.element_size() for p in model.parameters())
    out = dict(model_mb=round(held / _MB, 1))
    reader = HFReader(hf_dir)
    with _Peak() as m:
        load_hf_into_model([model], hf_dir, reader=reader)
    out["import"] = {**m.report(), "read_mb": round(reader.bytes_read / _MB, 1)}
    bridge = AutoBridge.from_hf_pretrained(hf_dir)
    with _Peak() as m:
        bridge.save_hf_weights([model], out_dir, False, max_shard_bytes=max_shard_bytes)
    out["export"] = m.report()
    os.makedirs(ckpt_dir, exist_ok=True)
    dist_checkpointing.save(model.sharded_state_dict(), ckpt_dir)
    return out


def _export_ckpt(hf_dir, ckpt_dir, out_dir, max_shard_bytes):
    """A fresh process (no model built): torch_dist checkpoint -> HF safetensors."""
    from gigatron.convert.bridge import AutoBridge

    bridge = AutoBridge.from_hf_pretrained(hf_dir)
    with _Peak() as m:
        bridge.export_ckpt(ckpt_dir, out_dir, False, max_shard_bytes=max_shard_bytes)
    return m.report()


def same_tensors(a: str, b: str) -> bool:
    """Both HF directories hold the same tensor names with bitwise equal bytes."""
    from gigatron.convert.hf_io import HFReader

    ra, rb = HFReader(a), HFReader(b)
    if sorted(ra.keys()) != sorted(rb.keys()):
        return False
    for name in ra.keys():
        x, y = ra.get(name), rb.get(name)
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if not torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)):
            return False
    return True


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--max-shard-bytes", type=int, default=None,
                   help="bytes per safetensors file (default: 1 GiB, tiny: 64 KiB)")  # fmt: skip
    p.add_argument("--dir", default=None, help="work directory on local disk (default: a temp dir)")
    p.add_argument("--timeout", type=float, default=3600.0)
    a = p.parse_args(argv)
    from gigatron.testing import run_distributed

    shard = a.max_shard_bytes or (64 * 1024 if a.config == "tiny" else 1024**3)
    work = a.dir or tempfile.mkdtemp(prefix="gigatron-bench-convert-")
    hf, out, ckpt, out2 = (os.path.join(work, n) for n in ("hf", "export", "ckpt", "export_ckpt"))
    for d in (hf, out, ckpt, out2):
        shutil.rmtree(d, ignore_errors=True)
    dtype = getattr(torch, a.dtype)
    t0 = time.perf_counter()
    shapes = write_checkpoint(hf, hf_config(a.config, a.dtype), dtype, shard)
    sizes = [torch.Size(s).numel() * dtype.itemsize for s in shapes.values()]
    write_s = time.perf_counter() - t0
    ranks = run_distributed(
        _rank, a.tp * a.pp, args=(hf, out, ckpt, a.tp, a.pp, a.dtype, shard), timeout=a.timeout
    )
    (export_ckpt,) = run_distributed(
        _export_ckpt, 1, args=(hf, ckpt, out2, shard), timeout=a.timeout
    )
    result = dict(
        bench="convert_streaming",
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        host=platform.node(), cpu=platform.processor() or platform.machine(),
        num_cpus=os.cpu_count(), torch=torch.__version__, python=platform.python_version(),
        config=a.config, dtype=a.dtype, tp=a.tp, pp=a.pp, shard_bytes=shard,
        num_files=len([n for n in os.listdir(hf) if n.endswith(".safetensors")]),
        params=sum(torch.Size(s).numel() for s in shapes.values()),
        checkpoint_mb=round(sum(sizes) / _MB, 1), largest_tensor_mb=round(max(sizes) / _MB, 1),
        write_seconds=round(write_s, 3), ranks=ranks,
        export_ckpt=export_ckpt,
        verified=same_tensors(hf, out) and same_tensors(hf, out2),
    )  # fmt: skip
    if a.dir is None:
        shutil.rmtree(work, ignore_errors=True)
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
