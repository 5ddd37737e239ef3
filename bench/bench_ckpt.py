"""Checkpoint save/load throughput (GB/s): gigatron vs megatron-core `dist_checkpointing`, as JSON.

    python bench/bench_ckpt.py --config tiny --device cpu                    # harness check
    python bench/bench_ckpt.py --config gpt-1.3b --device cuda --repeats 2   # the GPU claim

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
tests/dist/test_dist_ckpt_megatron_interop.py; the JSON's `payload` field says which was used.
megatron-core's writer starts helper processes on every save: a fixed cost of a few seconds.

`--impls gigatron-training` (opt-in) times gigatron.training.checkpointing's save_checkpoint /
load_checkpoint instead (iter dir, tracker file, RNG states, args; restored into the live model
and optimizer after setting them to NaN).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import gc
import importlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time

import torch
import torch.distributed as dist

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))
sys.path.insert(0, _HERE)

from bench_gpt import CONFIGS  # noqa: E402  (layers, hidden, heads, seq, vocab per config)

GPT_CONFIGS = sorted(c for c in CONFIGS if not CONFIGS[c].get("swiglu"))  # plain GPT shapes
IMPLS = ("gigatron", "megatron", "gigatron-training")  # the last one: opt-in
Side = collections.namedtuple("Side", "make_state params model optimizer")
STEP_TOKENS = 256  # sequence length of the one training step that creates the Adam state


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
            "(bench/bench_ckpt.py)"
        )
    return args


# ------------------------------------------------------------------ state-dict walking helpers


def _leaves(sd, path=()):
    """(path, leaf) of a nested dict/list state dict."""
    if isinstance(sd, dict):
        for k, v in sd.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(sd, list):
        for i, v in enumerate(sd):
            yield from _leaves(v, (*path, i))
    else:
        yield path, sd


def _is_tensor_leaf(v) -> bool:
    """A ShardedTensor or ShardedTensorFactory of either library (duck-typed)."""
    return torch.is_tensor(getattr(v, "data", None)) and hasattr(v, "key")


def _reference(sd) -> dict:
    """{path: tensor that will be saved} (taken before save: megatron's save edits the dict)."""
    return {p: v.data for p, v in _leaves(sd) if _is_tensor_leaf(v)}


def _map(sd, fn):
    """Same nested structure with `fn` applied to every sharded-tensor leaf."""
    if isinstance(sd, dict):
        return {k: _map(v, fn) for k, v in sd.items()}
    if isinstance(sd, list):
        return [_map(v, fn) for v in sd]
    return fn(sd) if _is_tensor_leaf(sd) else sd


def _fresh(sd):
    """Load targets: same layout, every sharded tensor's data a new NaN (or -1) tensor."""

    def nan_like(v):
        fill = float("nan") if v.data.is_floating_point() else -1
        return dataclasses.replace(v, data=torch.full_like(v.data, fill))

    return _map(sd, nan_like)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (NaN-safe, -0.0 != +0.0): megatron's padding is uninitialised memory."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _verify(reference: dict, loaded) -> tuple[bool, int, str]:
    """(all equal bitwise, tensors checked, first mismatch) of loaded vs reference tensors."""
    for path, want in reference.items():
        got = loaded
        try:
            for k in path:
                got = got[k]
        except (KeyError, IndexError, TypeError):
            return False, len(reference), "/".join(map(str, path))
        same = (
            torch.is_tensor(got)
            and got.dtype == want.dtype
            and got.shape == want.shape
            and (got.numel() == 0 or got.data_ptr() != want.data_ptr())  # not the saved tensor
            and torch.equal(_bits(got.to(want.device)), _bits(want))
        )
        if not same:
            return False, len(reference), "/".join(map(str, path))
    return True, len(reference), ""


def _payload_bytes(reference: dict) -> int:
    return sum(t.numel() * t.element_size() for t in reference.values())


def _dir_bytes(path: str) -> tuple[int, int]:
    """(apparent bytes, allocated bytes as du counts them) of every file under `path`."""
    apparent = allocated = 0
    for root, _, files in os.walk(path):
        for name in files:
            st = os.stat(os.path.join(root, name))
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return apparent, allocated


def _evict(path: str) -> None:
    """Push the files to disk and drop them from the page cache (no root needed)."""
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    if dist.is_initialized():
        dist.barrier()


# ------------------------------------------------------------------ the two sides


def _shape(args) -> dict:
    s = CONFIGS[args.config]
    return dict(layers=s["layers"], hidden=s["hidden"], heads=s["heads"], seq=s["seq"],
                vocab=s["vocab"])  # fmt: skip


def _train_step(ddp, optimizer, shape, device) -> None:
    """One forward/backward/optimizer step on random tokens (creates the Adam moments)."""
    s = min(shape["seq"], STEP_TOKENS)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, shape["vocab"], (1, s), generator=g).to(device)
    pos = torch.arange(s, device=device)[None]
    mask = torch.ones(1, 1, s, s, dtype=torch.bool, device=device).triu(1)  # True = masked
    ddp.zero_grad_buffer()
    ddp(tokens, pos, mask, labels=tokens).float().mean().backward()
    ddp.finish_grad_sync()
    ok = optimizer.step()[0]
    if not ok:
        raise RuntimeError("the optimizer skipped its step (bench_ckpt): no Adam state to save")


def _build(pkg: str, args):
    """(model, ddp, optimizer) from `pkg` ("gigatron.core" or "megatron.core": the same names)
    after one training step: GPTModel (local spec, bf16, tied embeddings), DDP, Adam."""

    def mod(name):
        return importlib.import_module(f"{pkg}.{name}")

    shape, bf16 = _shape(args), torch.bfloat16
    mod("parallel_state").initialize_model_parallel()
    torch.manual_seed(1234)
    mod("tensor_parallel.random").model_parallel_cuda_manual_seed(1234)
    cfg = mod("transformer.transformer_config").TransformerConfig(
        num_layers=shape["layers"], hidden_size=shape["hidden"],
        num_attention_heads=shape["heads"], hidden_dropout=0.0, attention_dropout=0.0,
        bf16=True, params_dtype=bf16, pipeline_dtype=bf16,
    )  # fmt: skip
    spec = mod("models.gpt.gpt_layer_specs").get_gpt_layer_local_spec()
    with torch.device(args.device):
        model = mod("models.gpt").GPTModel(
            config=cfg, transformer_layer_spec=spec, vocab_size=shape["vocab"],
            max_sequence_length=shape["seq"], share_embeddings_and_output_weights=True,
            position_embedding_type="learned_absolute",
        )  # fmt: skip
    model = model.to(device=args.device, dtype=bf16)
    distributed, optim = mod("distributed"), mod("optimizer")
    ddp_config = distributed.DistributedDataParallelConfig(
        use_distributed_optimizer=args.dist_opt, grad_reduce_in_fp32=True
    )
    ddp = distributed.DistributedDataParallel(config=cfg, ddp_config=ddp_config, module=model)
    opt_config = optim.OptimizerConfig(optimizer="adam", lr=1e-4, bf16=True, params_dtype=bf16,
                                       use_distributed_optimizer=args.dist_opt)  # fmt: skip
    optimizer = optim.get_megatron_optimizer(opt_config, [ddp])
    _train_step(ddp, optimizer, shape, args.device)
    return model, ddp, optimizer


def _gigatron_setup(args) -> Side:
    from gigatron.core.dist_checkpointing.optimizer import optimizer_sharded_state_dict
    from gigatron.training._checkpoint_state import model_sharded_state_dict

    model, ddp, optimizer = _build("gigatron.core", args)

    def make_state():
        # What gigatron.training's checkpoints save: stacked-layer model keys and the
        # per-parameter (fully reshardable) optimizer state.
        model_sd = model_sharded_state_dict(model)
        return {"model": model_sd, "optimizer": optimizer_sharded_state_dict(optimizer, model_sd)}

    return Side(make_state, sum(p.numel() for p in model.parameters()), ddp, optimizer)


def _megatron_setup(args) -> Side:
    """megatron-core's own model and optimizer state (CUDA only: its optimizer checks for it)."""
    model, ddp, optimizer = _build("megatron.core", args)
    metadata = {"distrib_optim_sharding_type": args.megatron_sharding_type}

    def make_state():
        model_sd = model.sharded_state_dict()
        optim_sd = optimizer.sharded_state_dict(model_sd, is_loading=False, metadata=metadata)
        return {"model": model_sd, "optimizer": optim_sd}

    return Side(make_state, sum(p.numel() for p in model.parameters()), ddp, optimizer)


def _megatron_plain_setup(args):
    """CPU stand-in: one plain megatron ShardedTensor per tensor of gigatron's payload."""
    from megatron.core.dist_checkpointing import ShardedTensor

    gigatron = _gigatron_setup(args)
    reference = _reference(gigatron.make_state())
    tensors = {"/".join(map(str, p)): t.detach().contiguous().clone() for p, t in reference.items()}

    def make_state():
        return {k: ShardedTensor.from_rank_offsets(k, t) for k, t in tensors.items()}

    return Side(make_state, gigatron.params, None, None)


@contextlib.contextmanager
def _megatron_cpu_stubs():
    """What megatron-core's writer needs from CUDA, on a CPU-only run (restored afterwards)."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    saved = (torch.cuda.synchronize, torch.cuda.current_device, filesystem_async._process_memory)
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    try:
        import psutil  # noqa: F401
    except ImportError:  # its writer logs process memory through psutil
        filesystem_async._process_memory = lambda: 0
    try:
        yield
    finally:
        torch.cuda.synchronize, torch.cuda.current_device = saved[:2]
        filesystem_async._process_memory = saved[2]


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
        _sync(args.device)
        t0 = time.perf_counter()
        lib.save(state, ckpt)
        _sync(args.device)
        out["save_s"].append(time.perf_counter() - t0)
        out["bytes_on_disk"], out["du_bytes"] = _dir_bytes(ckpt)
        out["payload_bytes"] = _payload_bytes(reference)
        if args.drop_cache:
            _evict(ckpt)
        _sync(args.device)
        t0 = time.perf_counter()
        loaded = lib.load(request, ckpt)
        _sync(args.device)
        out["load_s"].append(time.perf_counter() - t0)
        ok, count, bad = _verify(reference, loaded)
        out["verified"] = out["verified"] and ok
        out["verified_tensors"] = count
        if not ok:
            out["first_mismatch"] = bad
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
        _sync(args.device)
        t0 = time.perf_counter()
        checkpointing.save_checkpoint(1, side.model, side.optimizer, None, args=flags)
        _sync(args.device)
        out["save_s"].append(time.perf_counter() - t0)
        out["bytes_on_disk"], out["du_bytes"] = _dir_bytes(ckpt)
        out["payload_bytes"] = _payload_bytes(snapshot)
        if args.drop_cache:
            _evict(ckpt)
        with torch.no_grad():
            for t in live.values():
                t.fill_(float("nan") if t.is_floating_point() else -1)
        _sync(args.device)
        t0 = time.perf_counter()
        checkpointing.load_checkpoint(side.model, side.optimizer, None, args=flags)
        _sync(args.device)
        out["load_s"].append(time.perf_counter() - t0)
        restored = _map(side.make_state(), lambda v: v.data)
        ok, out["verified_tensors"], bad = _verify(snapshot, restored)
        out["verified"] = out["verified"] and ok
        if not ok:
            out["first_mismatch"] = bad
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
