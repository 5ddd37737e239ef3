"""Checkpoint save/load throughput (GB/s): gigatron vs megatron-core `dist_checkpointing`, as JSON.

    python bench/ckpt/bench_ckpt.py --config tiny --device cpu                    # harness check
    python bench/ckpt/bench_ckpt.py --config gpt-1.3b --device cuda --repeats 2   # the GPU claim

Each implementation builds a GPT of the config (bf16 params, local spec, tied embeddings), wraps
it in its DistributedDataParallel, builds its `get_megatron_optimizer` (Adam, fp32 main params,
`--dist-opt`: the distributed optimizer, else Float16OptimizerWithFloat16Params) and takes one
real training step so exp_avg / exp_avg_sq exist. Then, `--repeats` times: the model + optimizer
sharded state dict is saved with `dist_checkpointing.save` into an empty directory (the whole
call, DCP metadata and metadata.json included; both writers fsync their files themselves) and
loaded with `dist_checkpointing.load` into a fresh copy of the state dict whose tensors are NaN;
every loaded tensor must equal the saved one bitwise (`verified`). GB/s = bytes on disk (all
files of the checkpoint directory, 1e9 bytes per GB) / seconds. The directory is deleted after
each repeat. Loads read from the page cache unless `--drop-cache` (fsync + POSIX_FADV_DONTNEED of
every file before each load, untimed). One `RESULT {json}` line per implementation.

megatron-core's models and optimizers need CUDA; with `--device cpu` its side saves a same-bytes
payload instead (one plain ShardedTensor per tensor of gigatron's payload) through its writer,
with `torch.cuda.synchronize` / `current_device` stubbed as in
tests/core/dist_checkpointing/test_megatron_interop.py; the JSON's `payload` field says which was
used.
megatron-core's writer starts helper processes on every save: a fixed cost of a few seconds.

`--impls gigatron-training` (opt-in) times gigatron.training.checkpointing's save_checkpoint /
load_checkpoint instead (iter dir, tracker file, RNG states, args; restored into the live model
and optimizer after setting them to NaN).

Layout: this file is the CLI and the timing loops; `_libs.py` builds each library's
model, optimizer and state dict, `_state.py` walks, verifies and measures checkpoints.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import time

import torch
import torch.distributed as dist

# the repo root: gigatron and bench.* import without an install
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench._lib.args import CONFIGS  # noqa: E402  (layers, hidden, heads, seq, vocab per config)
from bench.ckpt._libs import (  # noqa: E402  (model + optimizer of each library)
    Side,
    _gigatron_setup,
    _megatron_cpu_stubs,
    _megatron_plain_setup,
    _megatron_setup,
)
from bench.ckpt._state import (  # noqa: E402  (state-dict walking, verification, disk)
    _fresh,
    _map,
    _record_files,
    _record_verify,
    _reference,
    _sync,
)

GPT_CONFIGS = sorted(c for c in CONFIGS if not CONFIGS[c].get("swiglu"))  # plain GPT shapes
IMPLS = ("gigatron", "megatron", "gigatron-training")  # the last one: opt-in


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=GPT_CONFIGS, default="tiny")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dir", default=None, help="parent of the checkpoints (default: a temp dir)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--impls", default="gigatron,megatron")
    p.add_argument("--dist-opt", action=argparse.BooleanOptionalAction, default=True,
                   help="use_distributed_optimizer on both sides (default on)")  # fmt: skip
    p.add_argument("--megatron-sharding-type", default="dp_reshardable",
                   help="distrib_optim_sharding_type (Megatron training's default)")  # fmt: skip
    p.add_argument("--drop-cache", action="store_true", help="evict the files before each load")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds for the whole run: later repeats are skipped (>= 1 per impl) "
                   "when they would not fit in the impl's share")  # fmt: skip
    args = p.parse_args(argv)
    unknown = set(args.impls.split(",")) - set(IMPLS)
    if unknown or args.repeats < 1:
        raise ValueError(
            f"--impls ({args.impls}) must be from {IMPLS} and --repeats ({args.repeats}) >= 1 "
            "(bench/ckpt/bench_ckpt.py)"
        )
    return args


# ------------------------------------------------------------------ timing


def _repeat_indices(args):
    """0 .. repeats-1, stopping early (after one) when the next repeat, taking as long as the
    last one, would end after `args.deadline` (set from --time-budget)."""
    last = 0.0
    for r in range(args.repeats):
        start = time.perf_counter()
        if r and getattr(args, "deadline", None) is not None and start + last > args.deadline:
            return
        yield r
        last = time.perf_counter() - start


def _timed(device: str, fn, *fn_args, **fn_kwargs) -> tuple[float, object]:
    """(seconds, result) of `fn(*fn_args, **fn_kwargs)`, the device and ranks synced around it."""
    _sync(device)
    t0 = time.perf_counter()
    result = fn(*fn_args, **fn_kwargs)
    _sync(device)
    return time.perf_counter() - t0, result


def _time_repeats(args, lib, make_state, root: str) -> dict:
    """Save / load / verify `--repeats` times; seconds, bytes and the verification outcome."""
    out = dict(save_s=[], load_s=[], state_dict_s=[], verified=True, verified_tensors=0)
    for r in _repeat_indices(args):
        ckpt = os.path.join(root, f"ckpt_{r}")
        shutil.rmtree(ckpt, ignore_errors=True)
        os.makedirs(ckpt)
        t0 = time.perf_counter()
        state = make_state()
        request = _fresh(make_state())  # load targets: same layout, NaN data
        reference = _reference(state)
        out["state_dict_s"].append(time.perf_counter() - t0)
        out["save_s"].append(_timed(args.device, lib.save, state, ckpt)[0])
        _record_files(out, ckpt, reference, args.drop_cache)
        seconds, loaded = _timed(args.device, lib.load, request, ckpt)
        out["load_s"].append(seconds)
        _record_verify(out, reference, loaded)
        del state, request, reference, loaded
        shutil.rmtree(ckpt)  # one checkpoint on disk at a time (a 1.3B one is ~21 GB)
    return out


def _time_training(args, side: Side, root: str) -> dict:
    """The training loop's path: gigatron.training.checkpointing.save_checkpoint (iter_0000001/,
    tracker, RNG states, args) and load_checkpoint into the live model and optimizer, whose
    tensors are set to NaN first; afterwards they must equal a copy taken before the save."""
    from gigatron.training import checkpointing

    out = dict(save_s=[], load_s=[], verified=True, verified_tensors=0)
    for r in _repeat_indices(args):
        ckpt = os.path.join(root, f"train_{r}")
        flags = argparse.Namespace(save=ckpt, load=ckpt)
        live = _reference(side.make_state())
        snapshot = {path: t.clone() for path, t in live.items()}
        save = (checkpointing.save_checkpoint, 1, side.model, side.optimizer, None)
        out["save_s"].append(_timed(args.device, *save, args=flags)[0])
        _record_files(out, ckpt, snapshot, args.drop_cache)
        with torch.no_grad():
            for t in live.values():
                t.fill_(float("nan") if t.is_floating_point() else -1)
        load = (checkpointing.load_checkpoint, side.model, side.optimizer, None)
        out["load_s"].append(_timed(args.device, *load, args=flags)[0])
        _record_verify(out, snapshot, _map(side.make_state(), lambda v: v.data))
        del live, snapshot
        shutil.rmtree(ckpt)
    return out


def _summary(timed: dict) -> dict:
    gb = timed["bytes_on_disk"] / 1e9
    save, load = timed["save_s"], timed["load_s"]
    return dict(
        save_s_all=save, load_s_all=load,
        save_s=min(save), save_s_mean=sum(save) / len(save),
        load_s=min(load), load_s_mean=sum(load) / len(load),
        save_gbps=gb / min(save), save_gbps_mean=gb * len(save) / sum(save),
        load_gbps=gb / min(load), load_gbps_mean=gb * len(load) / sum(load),
    )  # fmt: skip


def run_impl(args, impl: str, root: str) -> dict:
    """One implementation's result dict (an `error` / `skipped` entry instead of raising)."""
    base = dict(impl=impl, config=args.config, dist_opt=args.dist_opt, repeats=args.repeats,
                load_source="disk (evicted)" if args.drop_cache else "page cache")  # fmt: skip
    t0 = time.perf_counter()
    stubs = contextlib.nullcontext()
    if impl.startswith("gigatron"):
        from gigatron.core import dist_checkpointing as lib

        setup = _gigatron_setup
        base.update(payload="GPTModel + optimizer (gigatron.training checkpoint layout)")
        if impl == "gigatron-training":
            base.update(payload="save_checkpoint/load_checkpoint: GPTModel + optimizer + RNG "
                        "+ args, tracker file")  # fmt: skip
    else:
        try:
            from megatron.core import dist_checkpointing as lib
        except ImportError as err:
            return dict(base, skipped=f"megatron-core not importable: {err}")
        if args.device == "cuda":
            setup = _megatron_setup
            base.update(payload="GPTModel + optimizer (megatron-core)",
                        sharding_type=args.megatron_sharding_type)  # fmt: skip
        else:
            setup, stubs = _megatron_plain_setup, _megatron_cpu_stubs()
            base.update(payload="plain ShardedTensors, one per gigatron payload tensor "
                        "(megatron-core's GPTModel/optimizer need CUDA)")  # fmt: skip
    with stubs:
        side = setup(args)
        base.update(params=side.params, setup_s=time.perf_counter() - t0)
        if impl == "gigatron-training":
            timed = _time_training(args, side, root)
        else:
            timed = _time_repeats(args, lib, side.make_state, root)
    timed["repeats_done"] = len(timed["save_s"])
    summary = _summary(timed)
    del timed["save_s"], timed["load_s"]
    return {**base, **timed, **summary}


def _cleanup(device: str) -> None:
    from gigatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    with contextlib.suppress(ImportError):
        from megatron.core import parallel_state as mps

        mps.destroy_model_parallel()
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _environment(args) -> dict:
    env = dict(torch=torch.__version__, python=platform.python_version())
    with contextlib.suppress(ImportError):
        from megatron.core.package_info import __version__ as mcore_version

        env["megatron_core"] = mcore_version
    import gigatron

    env["gigatron"] = gigatron.__version__
    device = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor()
    return dict(versions=env, device_name=device or platform.machine(),
                date=datetime.datetime.now(datetime.UTC).isoformat())  # fmt: skip


def main(argv=None) -> list[dict]:
    args = _args(argv)
    backend = "nccl" if args.device == "cuda" else "gloo"
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if "WORLD_SIZE" in os.environ:  # torchrun
        dist.init_process_group(backend)
    else:
        init = tempfile.NamedTemporaryFile(prefix="bench_ckpt_init_", delete=False).name
        os.unlink(init)
        dist.init_process_group(backend, init_method=f"file://{init}", rank=0, world_size=1)
    if dist.get_world_size() != 1:
        raise ValueError(f"WORLD_SIZE ({dist.get_world_size()}) must be 1: one-GPU benchmark")
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="bench_ckpt_", dir=args.dir)
    results, impls, start = [], args.impls.split(","), time.perf_counter()
    try:
        for i, impl in enumerate(impls):
            if args.time_budget is not None:  # an equal share of what is left
                now = time.perf_counter()
                args.deadline = now + (args.time_budget - (now - start)) / (len(impls) - i)
            try:
                result = run_impl(args, impl, root)
            except Exception as err:  # report and go on to the other side
                error = f"{type(err).__name__}: {err}"[:2000]
                result = dict(impl=impl, config=args.config, error=error)
            result.update(_environment(args))
            results.append(result)
            print("RESULT", json.dumps(result), flush=True)
            _cleanup(args.device)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        dist.destroy_process_group()
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
