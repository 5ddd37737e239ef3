"""`gigatron estimate` without processes: the dry run over every rank of a layout, and the
meta trace's FLOPs against the training FLOPs formula."""

from __future__ import annotations

import contextlib

import pytest

from gigatron.tools.estimate.args import estimate_args

BASE = (
    "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 "
    "--max-position-embeddings 64 --micro-batch-size 4 --vocab-size 256 "
    "--hidden-dropout 0 --attention-dropout 0"
).split()


SMALL = (
    "--num-layers 8 --hidden-size 64 --num-attention-heads 4 --seq-length 64 "
    "--micro-batch-size 1 --global-batch-size 32 --vocab-size 256 --bf16 "
    "--tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 4 "
    "--num-layers-per-virtual-pipeline-stage 1 --use-distributed-optimizer"
).split()


def test_dry_run_checks_every_rank_and_matches_the_estimate():
    from gigatron.tools.estimate.dry_run import check_groups, dry_run
    from gigatron.tools.estimate.report import estimate

    args = estimate_args([*SMALL, "--world-size", "64"])
    rep = dry_run(args, gpus_per_node=8)
    assert rep["errors"] == [] and rep["models_built"] == 4
    assert [r["rank"] for r in rep["ranks"]] == list(range(64))
    assert rep["groups"]["tp"]["crossing_nodes"] == 0  # TP 2 inside nodes of 8
    assert rep["groups"]["pp"]["crossing_nodes"] == 16  # stages 16 ranks apart
    est = estimate(args)["ranks"]
    assert rep["stages"][0]["peak_bytes"] == est["first"]["peak_bytes"]
    assert rep["stages"][3]["peak_bytes"] == est["last"]["peak_bytes"]
    # the first stage holds the most microbatches in flight (interleaved warmup)
    assert est["first"]["activation_bytes"] > est["last"]["activation_bytes"]

    _, errors, _ = check_groups(args, gpus_per_node=1)  # TP 2 over one-GPU nodes
    assert len(errors) == 1 and "32 tp groups span nodes" in errors[0]
    with pytest.raises(ValueError, match="world size \\(60\\) is not divisible"):
        estimate_args([*SMALL, "--world-size", "60"])


def test_traced_flops_equal_the_training_flops_formula():
    """The meta trace sees every GEMM the model runs: their FLOPs are the formula's matmul
    terms exactly, and attention the formula's score terms halved (causal SDPA)."""
    from gigatron.tools.estimate.report import estimate
    from gigatron.tools.estimate.world import build_chunks, fake_rank
    from gigatron.training.flops import flops_per_token

    argv = [*BASE, "--swiglu", "--group-query-attention", "--num-query-groups", "2"]
    args = estimate_args([*argv, "--world-size", "1"])
    with fake_rank(args, 0):  # the estimate's model allocates nothing
        assert all(p.is_meta for c in build_chunks(args) for p in c.parameters())
    rank = estimate(args)["ranks"]["first"]
    kw = dict(
        num_layers=2, hidden_size=64, vocab_size=args.padded_vocab_size, num_attention_heads=4,
        num_query_groups=2, ffn_hidden_size=args.ffn_hidden_size, gated_linear_unit=True,
    )  # fmt: skip
    tokens = args.micro_batch_size * args.seq_length
    full = flops_per_token(seq_length=args.seq_length, **kw) * tokens
    no_scores = flops_per_token(seq_length=0, **kw) * tokens
    assert rank["flops_per_step"] == pytest.approx(no_scores + (full - no_scores) / 2, rel=1e-12)


def test_padded_vocabulary_is_the_one_training_builds():
    """Without --tokenizer-type training builds a NullTokenizer, whose EOD is one id past
    --vocab-size, and pads that (the estimate padded --vocab-size itself: one row short, or a
    whole padding block when --vocab-size was already a multiple)."""
    from gigatron.training import global_vars
    from gigatron.training.arguments import parse_args
    from gigatron.training.initialize import _build_tokenizer

    for extra in ([], ["--vocab-size", "384"], ["--make-vocab-size-divisible-by", "1"]):
        train = parse_args(argv=[*BASE, *extra, "--mock-data"])
        try:
            _build_tokenizer(train)
        finally:
            global_vars.set_tokenizer(None)
        args = estimate_args([*BASE, *extra, "--world-size", "1"])
        assert args.padded_vocab_size == train.padded_vocab_size, extra


MOE = [*BASE, "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "96",
       "--swiglu", "--disable-bias-linear"]  # fmt: skip
MOE_LAYOUTS = {  # world size, flags
    "grouped": (1, "--moe-grouped-gemm"),  # fp32: the per-expert loop
    "grouped-bf16": (1, "--moe-grouped-gemm --bf16"),  # torch._grouped_mm, as on a Hopper GPU
    "k1-of-3-sequential": (1, "--num-experts 3 --moe-router-topk 1"),
    "ep2-alltoall": (2, "--expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall"),
    "ep2-allgather": (2, "--expert-model-parallel-size 2 --moe-token-dispatcher-type allgather"),
    "ep2-dp4-distopt": (4, "--expert-model-parallel-size 2 --use-distributed-optimizer"),
    "tp2-sp-etp2-ep2": (4, "--tensor-model-parallel-size 2 --sequence-parallel "
                        "--expert-model-parallel-size 2 --expert-tensor-parallel-size 2 "
                        "--moe-token-dispatcher-type alltoall"),
}  # fmt: skip


def test_moe_flops_are_the_active_parameters_under_every_layout():
    """Routed MoE layers trace on meta with a balanced router (moe_trace.py): each rank's FLOPs
    equal the training formula's, which counts top-k experts per token (pretrain_gpt's MFU),
    divided over TP; the expert all-to-all / all-gather volume is reported per group, and the
    expert parameters' sync over the expert-DP group."""
    from gigatron.tools.estimate.report import estimate
    from gigatron.training.flops import flops_per_token

    for name, (world, extra) in MOE_LAYOUTS.items():
        args = estimate_args([*MOE, *extra.split(), "--world-size", str(world)])
        rank = estimate(args)["ranks"]["first"]
        assert "trace_error" not in rank, (name, rank)
        kw = dict(
            num_layers=2, hidden_size=64, vocab_size=args.padded_vocab_size,
            num_attention_heads=4, gated_linear_unit=True, num_experts=args.num_experts,
            moe_router_topk=args.moe_router_topk, moe_ffn_hidden_size=96,
        )  # fmt: skip
        tokens = args.micro_batch_size * args.seq_length
        full = flops_per_token(seq_length=args.seq_length, **kw) * tokens
        no_scores = flops_per_token(seq_length=0, **kw) * tokens
        want = (no_scores + (full - no_scores) / 2) / args.tensor_model_parallel_size
        assert rank["flops_per_step"] == pytest.approx(want, rel=1e-12), name
        comm = rank["comm_bytes_per_step"]
        if "alltoall" in name:
            assert comm["ep"] > 0, (name, comm)
        if "allgather" in name:
            assert comm["expert_tp_ep"] > 0, (name, comm)
        if "distopt" in name:  # fp32 expert grads reduce-scattered, params gathered, EDP = 2
            assert comm["expert_dp"] == pytest.approx(rank["expert_params"] * (4 + 4) / 2)


def test_step_time_prices_the_trace_with_the_calibration_table():
    from gigatron.tools.estimate.report import estimate_rank

    table = {  # one row each: every GEMM at 100 TFLOP/s, attention 50 forward / 25 backward
        "gemm": [{"m": 1, "n": 1, "k": 1, "tflops": 100.0}],
        "attention": [
            {"b": 1, "heads": 1, "seq": 1, "head_dim": 1, "fwd_tflops": 50.0, "bwd_tflops": 25.0}
        ],
        "memory_gbps": 1000.0,
        "op_overhead_us": 0.0,
    }
    args = estimate_args([*BASE, "--world-size", "1", "--global-batch-size", "8"])
    r = estimate_rank(args, 0, calibration=table, keep_traces=True)
    (tr,) = r["traces"]
    t, m = r["time"], 2  # two microbatches of 4
    assert t["gemm_s"] == pytest.approx(m * tr.gemm_flops / 100e12)
    fwd = sum(
        4.0 * b * h * s * s2 * d / 2 for b, h, s, s2, d, _, k in tr.attention if k == "forward"
    )
    assert t["attention_s"] == pytest.approx(m * (fwd / 50e12 + 2 * fwd / 25e12))
    assert t["other_s"] == pytest.approx(m * tr.other_bytes / 1e12)
    # DDP's fp32 grad buffer: zeroed and read by the norm once a step (no distributed optimizer)
    assert t["grad_buffer_s"] == pytest.approx(2 * r["params"] * 4 / 1e12)
    assert t["step_s"] == pytest.approx(
        t["gemm_s"] + t["attention_s"] + t["other_s"] + t["optimizer_s"] + t["grad_buffer_s"]
    )


def test_cli_prints_json_and_refuses_a_missing_world_size_in_one_line(capsys):
    import json

    from gigatron import cli

    argv = [*BASE, "--pipeline-model-parallel-size", "2", "--global-batch-size", "8"]
    assert cli.main(["estimate", *argv, "--world-size", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["ranks"]) == {"first", "last"} and report["layout"]["num_microbatches"] == 2
    assert cli.main(["estimate", *argv]) == 2
    assert capsys.readouterr().err.strip() == (
        "gigatron estimate: error: give --world-size N (the number of ranks of the planned job)"
    )


def _fused_stand_ins(helpers, mem):
    """The chunked cross entropy's elementwise helpers as a fused kernel allocates: only their
    outputs (CUDA compiles them; eager CPU would add fp32 [c, V] temporaries)."""
    from torch.utils._python_dispatch import _disable_current_modes

    def fused(fn):
        def run(*args):
            with _disable_current_modes():  # the helper's inside: registers of one kernel
                out = fn(*args)
            return out.clone()  # counted once, as the kernel's output

        return run

    return tuple(fused(f) for f in helpers)


@pytest.mark.parametrize("tokens", [4096, 8192])  # one chunk; two (three [c, V] alive at once)
def test_chunked_cross_entropy_backward_transient_is_chunk_buffers(monkeypatch, tokens):
    """With --cross-entropy-loss-fusion the estimate's transient (`logits_grad_bytes`) is what
    the chunked cross entropy's backward allocates (measured, GPTModel's chunk size), not the
    whole fp32 logits' gradient (old accounting: 11% / 23% off here, 2.3x at gpt-125m)."""
    import torch

    from gigatron.core.fusions import chunked_cross_entropy as ce
    from gigatron.tools.estimate.activations import Shape, logits_grad_bytes
    from gigatron.tools.estimate.measure import LiveTensorBytes

    vocab, hidden = 64, 8
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, 1, hidden, generator=g).bfloat16().requires_grad_()  # [s, b, h]
    w = torch.randn(vocab, hidden, generator=g).bfloat16().requires_grad_()  # [V, h]
    labels = torch.randint(0, vocab, (1, tokens), generator=g)  # [b, s]
    with LiveTensorBytes() as mem:
        monkeypatch.setitem(ce._HELPERS, "eager", _fused_stand_ins(ce._HELPERS["eager"], mem))
        loss = ce.chunked_linear_cross_entropy(x, w, labels, compiled=False, recompute=True)
        loss = loss.sum()
        before = mem.live
        mem.reset_peak()
        loss.backward()
    sh = Shape(
        seq=tokens, micro_batch=1, hidden=hidden, ffn=4 * hidden, heads=1, kv_groups=1,
        head_dim=hidden, vocab=vocab, tp=1, cp=1, sp=False, swiglu=False, rmsnorm=False,
        dropout=False, act_bytes=2, fused_ce=True,
    )  # fmt: skip
    assert mem.peak - before == pytest.approx(logits_grad_bytes(sh), rel=0.01)


def test_trace_prices_the_compiled_cross_entropy_helpers_as_fused_kernels(monkeypatch):
    """On meta the chunked cross entropy runs its eager helpers (~20 fp32 [c, V] passes per
    chunk); the trace records what CUDA runs: per chunk two reads of the logits in forward, one
    read and one write of their gradient in backward."""
    import torch

    from gigatron.core.fusions import chunked_cross_entropy as ce
    from gigatron.tools.estimate.trace import OpTrace, _compiled_ce_helpers

    tokens, vocab, hidden, chunk = 256, 4096, 8, 64
    with torch.device("meta"):
        x = torch.zeros(tokens, 1, hidden, dtype=torch.bfloat16, requires_grad=True)
        w = torch.zeros(vocab, hidden, dtype=torch.bfloat16, requires_grad=True)
        labels = torch.zeros(1, tokens, dtype=torch.long)
    traced = {}
    for fused in (False, True):
        tracer = OpTrace()
        ctx = _compiled_ce_helpers(tracer) if fused else contextlib.nullcontext()
        with tracer, ctx:
            loss = ce.chunked_linear_cross_entropy(x, w, labels, chunk_size=chunk, recompute=True)
            loss.sum().backward()
        traced[fused] = tracer.trace
    wide = 4 * tokens * vocab * 2  # [c, V] bf16 bytes moved over the 4 chunks
    dw = 4 * vocab * hidden * (4 + 4 + 2)  # per chunk dW += D^T x: fp32 read + write, bf16 read
    assert wide + dw <= traced[True].other_bytes <= 1.1 * (wide + dw)
    assert traced[False].other_bytes > 5 * traced[True].other_bytes  # what meta ran eager

    from gigatron.tools.estimate import trace
    from gigatron.tools.estimate.report import estimate_rank

    fused_ce = [*BASE, "--cross-entropy-loss-fusion", "--vocab-size", "8192", "--world-size", "1"]
    args = estimate_args(fused_ce)  # the model's trace goes through the same swap
    (model,) = estimate_rank(args, 0, keep_traces=True)["traces"]
    monkeypatch.setattr(trace, "_compiled_ce_helpers", lambda tracer: contextlib.nullcontext())
    (unswapped,) = estimate_rank(args, 0, keep_traces=True)["traces"]
    assert unswapped.other_bytes > 2 * model.other_bytes, (unswapped, model)


def test_optimizer_state_follows_the_optimizer_and_flat_step_rules():
    """bf16 with the distributed optimizer: Adam keeps a main copy and two moments plus the flat
    step's group id (19 bytes per parameter with the 2-byte parameter and 4-byte gradient), SGD
    one momentum buffer (none at momentum 0); a forced flat Adam step under SGD is refused in one
    line, as training refuses it."""
    from gigatron.tools.estimate.memory import precision_of

    dist_opt = [*BASE, "--bf16", "--use-distributed-optimizer", "--world-size", "2"]
    adam = precision_of(estimate_args(dist_opt))
    assert (adam.optimizer, adam.param + adam.grad + adam.optimizer) == (13, 19)
    sgd = precision_of(estimate_args([*dist_opt, "--optimizer", "sgd"]))
    assert sgd.optimizer == 4 + 4  # main copy + momentum
    plain = precision_of(estimate_args([*dist_opt, "--optimizer", "sgd", "--sgd-momentum", "0"]))
    assert plain.optimizer == 4
    with pytest.raises(ValueError, match="--flat-adam-step needs Adam"):
        precision_of(estimate_args([*dist_opt, "--optimizer", "sgd", "--flat-adam-step"]))
