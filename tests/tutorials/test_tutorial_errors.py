"""The errors learners meet in hand-built Megatron Core programs say what to do.

Most mistakes run in one 2-rank launch of learner_mistakes.py (through the `megatron.core`
alias); two that leave a peer waiting run alone. Each test asserts the key words of its message.
Against the code before these messages (git archive of the parent commit) each test fails:
KeyError (1, 0) at construction; a (8, 64)-vs-(64, 8, h) shape error, or a buffer allocated from
a garbage header ("Storage size calculation overflowed"); CP and dense-MoE models built without a
word; one unknown field per TypeError; a bare "cannot import name 'MoEMLP'"; a bare TypeError
for `/`; masked_fill_'s "only supports boolean masks" deep in attention; a checkpoint saved
over differing replicas; the BERT sample index looping forever (the launch times out);
AttributeError "_cuda_setDevice" without a hint; the T5 tokenizer error naming pretrain_bert.py;
no --vocab-extra-ids flag; --attention-dropout accepted under CP.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from gigatron.training.pretrain_bert import MaskedLMTokenizer
from gigatron.training.tokenizer import build_tokenizer
from tests.tutorials.conftest import ROOT, launch, preprocess

pytestmark = pytest.mark.multirank


MISTAKES = "tests/tutorials/learner_mistakes.py"
# one result; up to the next one even if another rank's output got onto the same line
_LINE = re.compile(r"\[rank (\d)\] MISTAKE (\w+): (.*?)(?=\[rank \d\] MISTAKE |$)", re.M)


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory, wordpiece_corpus):
    """{(rank, name): 'Type: message', "output": all output} of one 2-rank run of every
    symmetric mistake."""
    tmp = tmp_path_factory.mktemp("mistakes")
    _, vocab = wordpiece_corpus
    with open(tmp / "plain.jsonl", "w") as f:  # documents as plain text, not sentence lists
        for _ in range(20):
            f.write(json.dumps({"text": "The cat sees the tree. A dog likes the river."}) + "\n")
    prefix = preprocess(tmp / "plain.jsonl", tmp / "plain", vocab)
    out = launch(2, MISTAKES, "--ckpt-dir", str(tmp / "ckpt"), "--bert-prefix", prefix,
                 "--vocab-file", vocab, timeout=240)  # fmt: skip
    found = re.findall(_LINE, out)
    return {"output": out, **{(int(r), name): message for r, name, message in found}}


def _everywhere(mistakes, name: str, *words: str, kind: str = "ValueError") -> str:
    """The message `name` gave on both ranks, checked for `kind` and `words`."""
    messages = {mistakes.get((rank, name)) for rank in (0, 1)}
    assert len(messages) == 1, messages
    (message,) = messages
    assert message is not None and message.startswith(kind + ":"), message
    for word in words:
        assert word in message, (word, message)
    return message


@pytest.mark.timeout(300)
def test_pipeline_sizes_missing_from_the_config(mistakes):
    _everywhere(
        mistakes, "pp_config", "pipeline_model_parallel_size=2", "pipeline_model_parallel_size=1",
        "pre_process=parallel_state.is_pipeline_first_stage()",
        "post_process=parallel_state.is_pipeline_last_stage()",
    )  # fmt: skip


@pytest.mark.timeout(300)
def test_a_shape_header_is_checked_before_any_buffer(mistakes):
    assert mistakes[(0, "header")] == "no error"
    message = mistakes[(1, "header")]
    assert message.startswith("ValueError:") and "shape header" in message, message
    assert "no buffer was allocated" in message, message


@pytest.mark.timeout(300)
def test_context_parallel_missing_from_the_config(mistakes):
    _everywhere(
        mistakes, "cp_config", "context_parallel_size=2", "context_parallel_size=1",
        "attention_dropout=0.0",
    )  # fmt: skip


@pytest.mark.timeout(300)
def test_context_parallel_with_attention_dropout_is_refused_by_the_config(mistakes):
    _everywhere(mistakes, "cp_dropout", "attention_dropout (0.1)", "context_parallel_size (2)")


def test_context_parallel_with_attention_dropout_names_the_flag():
    from gigatron.training.arguments import parse_args, validate_args

    argv = ("--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 "
            "--micro-batch-size 2 --train-iters 2 --lr 1e-3 --mock-data --vocab-size 100 "
            "--context-parallel-size 2").split()  # fmt: skip
    with pytest.raises(ValueError, match="pass --attention-dropout 0"):
        validate_args(parse_args(argv=argv), 2)
    assert validate_args(parse_args(argv=argv + ["--attention-dropout", "0"]), 2)


@pytest.mark.timeout(300)
def test_experts_in_the_config_with_a_dense_spec(mistakes):
    _everywhere(mistakes, "moe_dense_spec", "num_moe_experts (4)", "dense MLP",
                "get_gpt_layer_local_spec(num_experts=")  # fmt: skip


@pytest.mark.timeout(300)
def test_all_unknown_config_fields_at_once(mistakes):
    message = _everywhere(mistakes, "unknown_fields", "3 unknown fields", kind="TypeError")
    for name, use in (
        ("moe_router_use_second_place", "moe_router_topk"),
        ("moe_min_capacity", "moe_expert_capacity_factor"),
        ("moe_expert_parallel_size", "expert_model_parallel_size"),
    ):
        assert f"no field '{name}'" in message and use in message, (name, message)


@pytest.mark.timeout(300)
def test_moe_mlp_imported_from_mlp(mistakes):
    _everywhere(mistakes, "moe_mlp_import", "'MoEMLP'", "SequentialMLP", kind="ImportError")


@pytest.mark.timeout(300)
def test_dividing_the_schedule_losses_points_to_num_microbatches(mistakes):
    _everywhere(mistakes, "losses_divided", "num_microbatches", "one per microbatch",
                kind="TypeError")  # fmt: skip


@pytest.mark.timeout(300)
def test_a_float_attention_mask_names_the_bool_convention(mistakes):
    _everywhere(mistakes, "float_mask", "torch.float32", "bool mask", "True where attention is "
                "masked out", "None for causal", kind="TypeError")  # fmt: skip


@pytest.mark.timeout(300)
def test_differing_replicas_are_refused_at_save(mistakes):
    _everywhere(
        mistakes, "replica_differs", "'embedding.position_embeddings.weight'", "ranks [0, 1]",
        "torch.manual_seed(seed)", "model_parallel_cuda_manual_seed(seed)",
        kind="CheckpointingException",
    )  # fmt: skip


@pytest.mark.timeout(300)
def test_replicas_a_few_ulps_apart_save_with_a_warning(mistakes):
    assert {mistakes.get((rank, "replica_rounding")) for rank in (0, 1)} == {"no error"}
    assert "differ across ranks at rounding level" in mistakes["output"]


@pytest.mark.timeout(300)
def test_bert_corpus_of_single_sentence_documents(mistakes):
    _everywhere(mistakes, "bert_single_sentence", "20 have fewer than 2 sentences",
                "--split-sentences", "--bert-no-binary-head")  # fmt: skip


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "name, words",
    [
        ("pp_defaults", ["stage 0 of 2 is not the last stage", "returned (2, 16)",
                         "post_process=parallel_state.is_pipeline_last_stage()"]),
        ("pp_pre_process", ["stage 1: its output does not depend on the activations",
                            "pre_process=parallel_state.is_pipeline_first_stage()"]),
    ],
)  # fmt: skip
def test_every_stage_building_the_whole_model(tmp_path, name, words):
    """Run alone: the stage that raises leaves its peer waiting, so torchrun ends the run."""
    out = launch(2, MISTAKES, "--ckpt-dir", str(tmp_path), "--only", name, ok=False)
    (message,) = {m for _, n, m in _LINE.findall(out) if n == name and "ValueError" in m}
    for word in words:
        assert word in message, (word, message)


@pytest.mark.timeout(120)
def test_cuda_calls_on_a_machine_without_cuda_get_the_cpu_path(tmp_path):
    script = tmp_path / "gpu_script.py"
    script.write_text(
        "import os\nimport torch\nfrom megatron.core import parallel_state\n\n"
        "world_size = torch.cuda.device_count()\n"
        "torch.cuda.set_device(int(os.environ.get('LOCAL_RANK', 0)))\n"
        "torch.distributed.init_process_group('nccl', world_size=world_size, rank=0)\n"
    )
    out = launch(0, str(script), ok=False)
    hint = out.strip().splitlines()[-1]
    for word in ("no CUDA device", "line 5: world_size = torch.cuda.device_count()",
                 "line 6: torch.cuda.set_device", "backend='gloo'",
                 "int(os.environ['WORLD_SIZE'])", "use_cpu_initialization=True"):  # fmt: skip
        assert word in hint, (word, hint)
    # an error that only names a CUDA-sounding function gets no hint
    script.write_text("raise ValueError('call model_parallel_cuda_manual_seed(seed) first')\n")
    out = launch(0, str(script), ok=False)
    assert "call model_parallel_cuda_manual_seed" in out and "no CUDA device" not in out, out


def test_t5_without_sentinels_names_pretrain_t5_and_the_flag(wordpiece_corpus):
    _, vocab = wordpiece_corpus
    args = SimpleNamespace(tokenizer_type="BertWordPieceLowerCase", vocab_file=vocab, rank=1)
    tokenizer = MaskedLMTokenizer(build_tokenizer(args))
    with pytest.raises(ValueError, match=r"--vocab-extra-ids 100 .*\(pretrain_t5\.py\)"):
        tokenizer.require("mask", "pad", "bos", "eos", "sentinels", script="pretrain_t5")
    args.vocab_extra_ids, args.padded_vocab_size = 100, None
    tokenizer = MaskedLMTokenizer(build_tokenizer(args))
    assert len(tokenizer.require("sentinels").additional_special_tokens_ids) == 100


@pytest.mark.timeout(150)
def test_pretrain_t5_with_a_bert_wordpiece_vocab_and_vocab_extra_ids(wordpiece_corpus, tmp_path):
    """Megatron's T5 command line: --tokenizer-type BertWordPieceLowerCase --vocab-extra-ids."""
    prefix, vocab = wordpiece_corpus
    argv = ("--encoder-num-layers 2 --decoder-num-layers 2 --hidden-size 32 "
            "--num-attention-heads 4 --encoder-seq-length 32 --decoder-seq-length 16 "
            "--max-position-embeddings 32 --micro-batch-size 4 --train-iters 3 --lr 1e-3 "
            "--eval-iters 0 --split 100,0,0 --tokenizer-type BertWordPieceLowerCase "
            "--vocab-extra-ids 100 --log-interval 1 --num-workers 0").split()  # fmt: skip
    argv += ["--vocab-file", vocab, "--data-path", prefix, "--data-cache-path", str(tmp_path)]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "gigatron.training.pretrain_t5", *argv]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=140)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert len(re.findall(r"iteration\s+\d+/\s*3", out)) == 3, out[-3000:]
