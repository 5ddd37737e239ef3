"""Mistakes learners make in hand-built Megatron Core programs, each printed with its error.

    torchrun --nproc-per-node 2 -m gigatron.compat.megatron tests/tutorials/learner_mistakes.py \\
        --ckpt-dir DIR --bert-prefix PREFIX --vocab-file VOCAB [--only NAME ...]

Written against `megatron.core`, run by tests/tutorials/test_tutorial_errors.py. Each mistake
below raises on every rank before anything is left half-done (or on the one rank that sees it,
for `header`), so one process per rank runs them all in turn; a mistake that leaves a peer
waiting (`pp_defaults`, `pp_pre_process`) is run alone with --only. With 4 ranks `pp_config` is
the TP 2 x PP 2 case. Each result is one line on stdout:
`[rank R] MISTAKE name: ExceptionType: message` (newlines shown as " | "), or `... no error`.
"""

import argparse
import os
import sys

import torch
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer.transformer_config import TransformerConfig

SEQ, MB, VOCAB = 16, 2, 64
SMALL = dict(num_layers=2, hidden_size=32, num_attention_heads=4, use_cpu_initialization=True)


def gpt(config, **kw):
    return GPTModel(config, get_gpt_layer_local_spec(), VOCAB, SEQ, **kw)


def batches():
    tokens = torch.randint(0, VOCAB, (MB, SEQ))
    while True:
        yield tokens


def forward_step(data_iterator, model):
    tokens = next(data_iterator)
    position_ids = torch.arange(SEQ).expand(MB, -1)
    loss = model(tokens, position_ids, None, labels=tokens)
    return loss, lambda out: (out.float().mean(), {"lm loss": out.float().mean().detach()})


def schedule(model, **kw):
    return get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=batches(), model=model, num_microbatches=1,
        seq_length=SEQ, micro_batch_size=MB, **kw,
    )  # fmt: skip


def pp_config(args):
    """parallel_state has pipeline stages; the config was written without them."""
    world = torch.distributed.get_world_size()
    parallel_state.initialize_model_parallel(world // 2, 2)
    gpt(TransformerConfig(**SMALL, pipeline_dtype=torch.float32))


def pp_defaults(args):
    """The config knows the pipeline, but every stage builds the whole model (pre_process and
    post_process left at True): the first stage returns a loss where activations are due."""
    parallel_state.initialize_model_parallel(1, 2)
    model_parallel_cuda_manual_seed(1)
    model = gpt(TransformerConfig(**SMALL, pipeline_dtype=torch.float32,
                                  pipeline_model_parallel_size=2))  # fmt: skip
    schedule(model)


def pp_pre_process(args):
    """post_process follows the stage, pre_process is left at True: the second stage embeds the
    tokens itself and ignores the activations it receives."""
    parallel_state.initialize_model_parallel(1, 2)
    model_parallel_cuda_manual_seed(1)
    config = TransformerConfig(**SMALL, pipeline_dtype=torch.float32,
                               pipeline_model_parallel_size=2)  # fmt: skip
    schedule(gpt(config, post_process=parallel_state.is_pipeline_last_stage()))


def header(args):
    """A receiving stage gets a shape header that is not one: what a stage sending a loss [b, s]
    with variable_seq_lengths put on the wire (2 ints where [s, b, h] was due). The sending side
    now refuses such a tensor itself, so rank 0 sends the raw ints as the old code did."""
    from megatron.core.pipeline_parallel.p2p_communication import (
        Message,
        P2PCommunicator,
        _tag,
    )

    parallel_state.initialize_model_parallel(1, 2)
    config = TransformerConfig(
        **SMALL, pipeline_dtype=torch.float32, pipeline_model_parallel_size=2,
        variable_seq_lengths=True,
    )  # fmt: skip
    comm = P2PCommunicator(parallel_state.get_pipeline_model_parallel_group(), config)
    if comm.is_pp_first_stage:
        torch.distributed.send(
            torch.tensor([MB, SEQ], dtype=torch.int64), comm.next_rank,
            group=comm.pp_group, tag=_tag(Message(True), True, True),
        )  # fmt: skip
    else:
        comm.recv_forward((SEQ, MB, SMALL["hidden_size"]), is_first_stage=False)


def cp_config(args):
    """parallel_state has a context-parallel group; the config does not know."""
    parallel_state.initialize_model_parallel(context_parallel_size=2)
    gpt(TransformerConfig(**SMALL, attention_dropout=0.0))


def cp_dropout(args):
    """Context parallelism with TransformerConfig's default attention_dropout (0.1)."""
    TransformerConfig(**SMALL, context_parallel_size=2)


def moe_dense_spec(args):
    """Experts in the config, but the layer spec from get_gpt_layer_local_spec() is dense."""
    parallel_state.initialize_model_parallel(expert_model_parallel_size=2)
    config = TransformerConfig(
        **SMALL, num_moe_experts=4, moe_router_topk=2, expert_model_parallel_size=2
    )
    gpt(config)


def unknown_fields(args):
    """Three MoE fields from other frameworks' tutorials, none of them Megatron's."""
    TransformerConfig(
        **SMALL, num_moe_experts=4, moe_router_use_second_place=True, moe_min_capacity=4,
        moe_expert_parallel_size=2,
    )  # fmt: skip


def moe_mlp_import(args):
    from megatron.core.transformer.mlp import MoEMLP  # noqa: F401


def losses_divided(args):
    """Gradient accumulation done by hand on the schedule's return value."""
    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(1)
    losses_reduced = schedule(gpt(TransformerConfig(**SMALL)))
    return losses_reduced / 4


def float_mask(args):
    """The attention mask built as tutorials draw it, `torch.ones(b, 1, s, s)` (1 = attend):
    Megatron's masks are bool, True = masked out (None: causal)."""
    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(1)
    tokens = next(batches())
    position_ids = torch.arange(SEQ).expand(MB, -1)
    gpt(TransformerConfig(**SMALL))(tokens, position_ids, torch.ones(MB, 1, SEQ, SEQ))


def replica_differs(args):
    """Each rank seeds its own way (as data-parallel tutorials do to vary the data) and skips
    model_parallel_cuda_manual_seed: TP ranks build different copies of the replicated weights
    (position embeddings), and the checkpoint would keep only one of them. A torchrun script
    that seeds nothing gets the same error (different here only because earlier mistakes of this
    process seeded the generators)."""
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    torch.manual_seed(1234 + torch.distributed.get_rank())
    model = gpt(TransformerConfig(**SMALL, tensor_model_parallel_size=2))
    dist_checkpointing.save(model.sharded_state_dict(), args.ckpt_dir)


def replica_rounding(args):
    """Not a mistake: replicas a few ulps apart (kernels summing in another order) save, with a
    warning; the check refuses only copies that differ in value."""
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    torch.manual_seed(1234)
    model_parallel_cuda_manual_seed(1234)
    model = gpt(TransformerConfig(**SMALL, tensor_model_parallel_size=2))
    weight = model.embedding.position_embeddings.weight
    if parallel_state.get_tensor_model_parallel_rank() == 1:
        with torch.no_grad():
            weight.copy_(torch.nextafter(weight, weight + 1))
    dist_checkpointing.save(model.sharded_state_dict(), args.ckpt_dir + "-rounding")


def bert_single_sentence(args):
    """A corpus preprocessed without --split-sentences: one sequence per document, but BERT's
    binary head needs two sentences per sample (the sample index used to spin forever)."""
    from megatron.core.datasets.bert_dataset import (
        BERTMaskedWordPieceDataset,
        BERTMaskedWordPieceDatasetConfig,
    )
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.training.tokenizer.tokenizer import _BertWordPieceTokenizer

    parallel_state.initialize_model_parallel()
    config = BERTMaskedWordPieceDatasetConfig(
        random_seed=1, sequence_length=32, blend=([args.bert_prefix], None), split="100,0,0",
        path_to_cache=args.ckpt_dir + "-cache", tokenizer=_BertWordPieceTokenizer(args.vocab_file),
        masking_probability=0.15, short_sequence_probability=0.1, masking_max_ngram=3,
        masking_do_full_word=True, masking_do_permutation=False, masking_use_longer_ngrams=False,
        masking_use_geometric_distribution=False, classification_head=True,
    )  # fmt: skip
    BlendedMegatronDatasetBuilder(BERTMaskedWordPieceDataset, [64, None, None], lambda: True,
                                  config).build()  # fmt: skip


_ALL = (pp_config, header, cp_config, cp_dropout, moe_dense_spec, unknown_fields,
        moe_mlp_import, losses_divided, float_mask, replica_differs, replica_rounding,
        bert_single_sentence)  # fmt: skip
MISTAKES = {f.__name__: f for f in _ALL}
ALONE = {f.__name__: f for f in (pp_defaults, pp_pre_process)}


def report(rank: int, name: str, result: str) -> None:
    # one write: print() writes the newline separately, and unbuffered ranks interleave
    sys.stdout.write(f"[rank {rank}] MISTAKE {name}: {result}\n")
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--bert-prefix")
    parser.add_argument("--vocab-file")
    args = parser.parse_args()
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    if rank == 0:
        os.makedirs(args.ckpt_dir, exist_ok=True)
        os.makedirs(args.ckpt_dir + "-rounding", exist_ok=True)
    torch.distributed.barrier()
    for name in args.only or list(MISTAKES):
        try:
            {**MISTAKES, **ALONE}[name](args)
            result = "no error"
        except Exception as err:  # the point: show what the learner sees
            result = f"{type(err).__name__}: {err}".replace("\n", " | ")
            if name in ALONE:  # a peer waits for this rank: stop, torchrun ends the others
                report(rank, name, result)
                raise
        finally:
            parallel_state.destroy_model_parallel()
        report(rank, name, result)
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
