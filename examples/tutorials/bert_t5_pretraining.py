"""BERT and T5 pretraining by hand, from a preprocessed corpus and a WordPiece vocabulary.

    python examples/tutorials/make_wordpiece_corpus.py data/
    gigatron preprocess --input data/corpus.jsonl --output-prefix data/corpus \\
        --tokenizer-type BertWordPieceLowerCase --vocab-file data/vocab.txt
    python -m gigatron.compat.megatron examples/tutorials/bert_t5_pretraining.py \\
        --data-prefix data/corpus_text_document --vocab-file data/vocab.txt --model bert t5

Written against `megatron.core` (and `megatron.training`'s tokenizer). BERT: masked-LM plus the
binary next-sentence head, on BERTMaskedWordPieceDataset samples (pairs of sentence runs of one
document). T5: span corruption on T5MaskedWordPieceDataset samples (masked spans become the
<extra_id_i> sentinels the tokenizer adds with vocab_extra_ids). One process by default; torchrun
adds data-parallel ranks. docs/learn.md walks through it.
"""

import argparse
import copy
import os
from functools import partial
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.datasets.bert_dataset import (
    BERTMaskedWordPieceDataset,
    BERTMaskedWordPieceDatasetConfig,
)
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.t5_dataset import (
    T5MaskedWordPieceDataset,
    T5MaskedWordPieceDatasetConfig,
)
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.distributed.finalize_model_grads import finalize_model_grads
from megatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
from megatron.core.models.bert.bert_model import BertModel
from megatron.core.models.T5 import T5Model
from megatron.core.models.T5.t5_spec import (
    get_t5_decoder_with_local_block_spec,
    get_t5_encoder_with_local_block_spec,
)
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.training.tokenizer import build_tokenizer
from torch.utils.data import DataLoader

SEQ_LENGTH, DECODER_SEQ_LENGTH, MICRO_BATCH_SIZE = 32, 16, 8
USE_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda") if USE_CUDA else torch.device("cpu")


def masking(max_ngram: int, geometric: bool) -> dict:
    """Megatron's pretrain_bert (max_ngram 3) / pretrain_t5 (10, geometric) masking settings."""
    return dict(
        masking_probability=0.15,
        short_sequence_probability=0.1,
        masking_max_ngram=max_ngram,
        masking_do_full_word=True,
        masking_do_permutation=False,
        masking_use_longer_ngrams=False,
        masking_use_geometric_distribution=geometric,
    )


def train_dataset(kind: str, args, tokenizer, num_samples: int):
    common = dict(
        random_seed=1234,
        sequence_length=SEQ_LENGTH,
        blend=([args.data_prefix], None),
        split="100,0,0",  # every document in the training split
        path_to_cache=os.path.join(os.path.dirname(args.data_prefix), "cache"),
        tokenizer=tokenizer,
    )
    if kind == "bert":
        # classification_head=True: samples are two runs of sentences, the second one swapped
        # in from elsewhere half the time; the binary head predicts which
        config = BERTMaskedWordPieceDatasetConfig(
            **common, **masking(3, False), classification_head=True
        )
        cls = BERTMaskedWordPieceDataset
    else:
        config = T5MaskedWordPieceDatasetConfig(
            **common, **masking(10, True), sequence_length_decoder=DECODER_SEQ_LENGTH
        )
        cls = T5MaskedWordPieceDataset
    train, _, _ = BlendedMegatronDatasetBuilder(
        cls, [num_samples, None, None], lambda: True, config
    ).build()
    return train


def build_model(kind: str, vocab_size: int):
    config = TransformerConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        activation_func=F.gelu,
        use_cpu_initialization=True,
    )
    if kind == "bert":
        model = BertModel(
            config=config,
            num_tokentypes=2,  # sentence A / sentence B embeddings
            transformer_layer_spec=bert_layer_local_spec,
            vocab_size=vocab_size,
            max_sequence_length=SEQ_LENGTH,
            add_binary_head=True,
        )
    else:
        encoder_config = copy.deepcopy(config)
        model = T5Model(
            config=config,
            encoder_config=encoder_config,
            transformer_encoder_layer_spec=get_t5_encoder_with_local_block_spec(2),
            transformer_decoder_layer_spec=get_t5_decoder_with_local_block_spec(2),
            vocab_size=vocab_size,
            max_sequence_length=SEQ_LENGTH,
        )
    return model.to(DEVICE)


def masked_mean(per_token_loss, loss_mask):
    loss_mask = loss_mask.float()
    return torch.sum(per_token_loss.float() * loss_mask) / loss_mask.sum().clamp(min=1)


def bert_loss(loss_mask, is_random, output_tensor):
    lm_loss_per_token, binary_logits = output_tensor
    lm_loss = masked_mean(lm_loss_per_token, loss_mask)
    sop_loss = F.cross_entropy(binary_logits.float(), is_random.view(-1))
    loss = lm_loss + sop_loss
    return loss, {"lm loss": lm_loss.detach().clone(), "sop loss": sop_loss.detach().clone()}


def bert_forward_step(data_iterator, model):
    b = {k: v.to(DEVICE) for k, v in next(data_iterator).items()}
    output = model(b["text"], b["padding_mask"], tokentype_ids=b["types"], lm_labels=b["labels"])
    return output, partial(bert_loss, b["loss_mask"], b["is_random"])


def t5_loss(loss_mask, output_tensor):
    loss = masked_mean(output_tensor, loss_mask)
    return loss, {"lm loss": loss.detach().clone()}


def t5_forward_step(data_iterator, model):
    b = {k: v.to(DEVICE) for k, v in next(data_iterator).items()}
    # [b, 1, s, s] boolean masks (True = masked) for the encoder, the causal decoder and the
    # decoder's attention to the encoder
    masks = T5MaskedWordPieceDataset.config_attention_mask(
        b["text_enc"], b["text_dec"], b["enc_mask"], b["dec_mask"], use_local=True
    )
    output = model(b["text_enc"], b["text_dec"], *masks, lm_labels=b["labels"])
    return output, partial(t5_loss, b["loss_mask"])


def train(kind: str, args) -> None:
    # Megatron's WordPiece tokenizer: [CLS] [SEP] [MASK] [PAD] from vocab.txt, [BOS] [EOS] added,
    # and for T5 the <extra_id_i> sentinels (vocab_extra_ids)
    tok_args = SimpleNamespace(
        tokenizer_type="BertWordPieceLowerCase",
        vocab_file=args.vocab_file,
        vocab_extra_ids=100 if kind == "t5" else 0,
        make_vocab_size_divisible_by=128,
        tensor_model_parallel_size=1,
        rank=torch.distributed.get_rank(),
    )
    tokenizer = build_tokenizer(tok_args)
    num_samples = args.steps * MICRO_BATCH_SIZE * parallel_state.get_data_parallel_world_size()
    dataset = train_dataset(kind, args, tokenizer, num_samples)
    model = build_model(kind, tok_args.padded_vocab_size)
    ddp_model = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
    optimizer = get_megatron_optimizer(OptimizerConfig(lr=args.lr), [ddp_model])
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset,
        num_replicas=parallel_state.get_data_parallel_world_size(),
        rank=parallel_state.get_data_parallel_rank(),
        shuffle=False,
    )
    batches = iter(DataLoader(dataset, batch_size=MICRO_BATCH_SIZE, sampler=sampler))
    forward_step = bert_forward_step if kind == "bert" else t5_forward_step
    for step in range(args.steps):
        ddp_model.zero_grad_buffer()
        optimizer.zero_grad()
        reports = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=batches,
            model=ddp_model,
            num_microbatches=1,
            seq_length=SEQ_LENGTH,
            micro_batch_size=MICRO_BATCH_SIZE,
        )
        finalize_model_grads([ddp_model])
        optimizer.step()
        if torch.distributed.get_rank() == 0:
            losses = ", ".join(f"{k} {float(v):.4f}" for k, v in reports[0].items())
            print(f"{kind} step {step}: {losses}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-prefix", required=True, help="preprocessed corpus (no .bin/.idx)")
    parser.add_argument("--vocab-file", required=True)
    parser.add_argument("--model", nargs="+", default=["bert", "t5"], choices=["bert", "t5"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=5e-3)
    args = parser.parse_args()
    for name, default in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29531"),
                          ("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):  # fmt: skip
        os.environ.setdefault(name, default)  # plain `python`: one rank; torchrun sets them
    if USE_CUDA:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group(backend="nccl" if USE_CUDA else "gloo")
    parallel_state.initialize_model_parallel()
    torch.manual_seed(1234)
    model_parallel_cuda_manual_seed(1234)
    for kind in args.model:
        train(kind, args)
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
