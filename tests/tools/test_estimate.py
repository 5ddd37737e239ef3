"""`gigatron estimate` without processes: the dry run over every rank of a layout, and the
meta trace's FLOPs against the training FLOPs formula."""

from __future__ import annotations

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
    assert t["step_s"] == pytest.approx(
        t["gemm_s"] + t["attention_s"] + t["other_s"] + t["optimizer_s"]
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
