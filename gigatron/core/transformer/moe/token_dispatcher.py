"""Token dispatchers: move routed tokens to the ranks holding their experts and back.

Mirrors `megatron.core.transformer.moe.token_dispatcher`. Both dispatchers run the same six
steps (`dispatch_preprocess`, `token_dispatch`, `dispatch_postprocess`, expert compute,
`combine_preprocess`, `token_combine`, `combine_postprocess`):

- `MoEAllGatherTokenDispatcher` ("allgather"): all-gather every token, its probs and routing map
  over the expert TP x EP group; each rank runs its local experts on the tokens routed to them
  (partial sums over the expert-TP split of the ffn), scatters them back to token order and
  reduce-scatters over TP x EP.
- `MoEAlltoAllTokenDispatcher` ("alltoall"): permute this rank's tokens by expert, all-to-all-v
  over EP with per-expert counts, all-gather over expert TP, regroup the received chunks by local
  expert; the combine reverses each step (reduce-scatter over expert TP, all-to-all back,
  un-permute with a sum over the k copies of each token). With shared experts set
  (`set_shared_experts`: `moe_shared_expert_overlap=True` and ep > 1) both all-to-alls are
  issued asynchronously and the shared experts' fc1 + activation run while the dispatch one is
  in flight, their fc2 while the combine one is (Megatron's split); `combine_postprocess` adds
  their output. In the eager backward the reverse all-to-alls overlap the shared experts'
  backward the same way (`all_to_all_async`); under torch.compile they block.
The routing probs travel with the tokens and are applied inside the experts. When one rank
holds every expert and nothing is dropped (`dropless_local`), both permute with
`moe_utils.permute_dropless` instead: T*k rows, counts on device, no host sync (compiled MoE
layers are one graph); EP / expert TP > 1 reads the counts on the host for the split sizes.

Shapes: T: tokens on this rank ([s/tp * b] under SP), E: experts, n: local experts, h: hidden,
N: (token, expert) rows handled by this rank's experts, ep / etp: expert parallel / expert TP size.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gigatron.core.tensor_parallel.mappings import (
    _gather_along_first_dim,  # Megatron's path to the raw gather
    all_to_all,
    all_to_all_async,
    gather_from_sequence_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)
from gigatron.core.transformer.moe.moe_utils import (
    get_default_pg_collection,
    permute,
    permute_dropless,
    sort_chunks_by_idxs,
    unpermute,
    unpermute_dropless,
)
from gigatron.core.utils import group_rank, group_size


class MoETokenDispatcher:
    """Common state: config, groups and this rank's local experts."""

    def __init__(
        self,
        num_local_experts: int,
        local_expert_indices: list[int],
        config,
        pg_collection=None,
    ) -> None:
        if pg_collection is None:  # Megatron's default: parallel_state's groups
            pg_collection = get_default_pg_collection()
        self.config = config
        self.num_local_experts = num_local_experts
        self.local_expert_indices = local_expert_indices
        self.ep_group, self.tp_group = pg_collection.ep, pg_collection.expt_tp
        self.tp_ep_group = pg_collection.tp_ep
        self.ep_size, self.tp_size = group_size(self.ep_group), group_size(self.tp_group)
        self.tp_ep_size = group_size(self.tp_ep_group)
        self.ep_rank, self.tp_rank = group_rank(self.ep_group), group_rank(self.tp_group)
        self.hidden_shape = None
        self.shared_experts = None
        # One rank holds every expert and no capacity drops tokens: each token has exactly k
        # rows, so `permute_dropless` keeps static shapes and the counts on device (no host
        # sync; the experts' grouped GEMM takes its offsets on device). EP / expert TP > 1 needs
        # the counts on the host for the collectives' split sizes.
        self.dropless_local = self.tp_ep_size == 1 and config.moe_expert_capacity_factor is None
        self.topk = config.moe_router_topk

    def set_shared_experts(self, shared_experts) -> None:
        """Run `shared_experts` (a SharedExpertMLP) inside the dispatch and combine (overlap)."""
        self.shared_experts = shared_experts

    def combine_postprocess(self, hidden_states: Tensor) -> Tensor:
        """[T, h] -> the layer's input shape [s, b, h]."""
        return hidden_states.view(self.hidden_shape)


class MoEAllGatherTokenDispatcher(MoETokenDispatcher):
    """All-gather over expert TP x EP, local experts, reduce-scatter back."""

    def dispatch_preprocess(self, hidden_states: Tensor, routing_map: Tensor, probs: Tensor):
        """[s, b, h] -> [T, h]; keeps the routing map [T, E]."""
        self.hidden_shape = hidden_states.shape
        self.routing_map = routing_map
        return hidden_states.reshape(-1, self.hidden_shape[-1]), probs

    def token_dispatch(self, hidden_states: Tensor, probs: Tensor):
        """[T, h], probs [T, E] -> gathered over TP x EP: [T * tp_ep, h], [T * tp_ep, E]."""
        if self.tp_ep_size > 1:
            hidden_states = gather_from_sequence_parallel_region(
                hidden_states, group=self.tp_ep_group
            )
            probs = gather_from_sequence_parallel_region(probs, group=self.tp_ep_group)
            self.routing_map = _gather_along_first_dim(
                self.routing_map.to(torch.uint8), self.tp_ep_group
            ).bool()
        return hidden_states, probs

    def dispatch_postprocess(self, hidden_states: Tensor, probs: Tensor):
        """Keep rows routed to local experts, grouped by expert -> ([N, h], counts [n], [N])."""
        if self.dropless_local:
            permuted, permuted_probs, counts, self.sorted_indices = permute_dropless(
                hidden_states, self.routing_map, probs, self.topk
            )
            return permuted, counts, permuted_probs
        first = self.local_expert_indices[0]
        local_map = self.routing_map[:, first : first + self.num_local_experts]  # [T', n]
        local_probs = probs[:, first : first + self.num_local_experts]
        self.tokens_shape = hidden_states.shape
        permuted, permuted_probs, self.sorted_indices = permute(
            hidden_states, local_map, local_probs
        )
        tokens_per_expert = local_map.sum(dim=0).cpu()
        return permuted, tokens_per_expert, permuted_probs

    def combine_preprocess(self, expert_output: Tensor) -> Tensor:
        """[N, h] -> [T * tp_ep, h] partial outputs in token order."""
        if self.dropless_local:
            return unpermute_dropless(expert_output, self.sorted_indices, self.topk)
        return unpermute(expert_output, self.sorted_indices, self.tokens_shape)

    def token_combine(self, hidden_states: Tensor) -> Tensor:
        """Sum the partial outputs over TP x EP and keep this rank's tokens -> [T, h]."""
        if self.tp_ep_size > 1:
            hidden_states = reduce_scatter_to_sequence_parallel_region(
                hidden_states, group=self.tp_ep_group
            )
        return hidden_states


class MoEAlltoAllTokenDispatcher(MoETokenDispatcher):
    """Permute by expert, all-to-all-v over EP, all-gather over expert TP (and back)."""

    def _count(self, routing_map: Tensor) -> None:
        """Split sizes of every collective from the per-expert token counts."""
        n, ep, etp = self.num_local_experts, self.ep_size, self.tp_size
        local_counts = routing_map.sum(dim=0).to(torch.int64)  # [E]
        self.input_splits = local_counts.view(ep, n).sum(dim=1).tolist()  # rows to each EP rank
        counts = local_counts.unsqueeze(0)
        if ep > 1:  # [ep, E]: what every EP peer routes to every expert
            counts = _gather_along_first_dim(counts, self.ep_group)
        first = self.local_expert_indices[0]
        counts = counts[:, first : first + n]  # [ep, n]: rows arriving for my experts
        self.output_splits = counts.sum(dim=1).tolist()
        if etp > 1:  # [etp, ep, n]: the same for each expert-TP peer (different tokens under SP)
            counts = _gather_along_first_dim(counts.unsqueeze(0), self.tp_group)
        counts = counts.reshape(-1, n)  # [etp * ep, n], row = (etp rank, ep source)
        self.output_splits_tp = counts.reshape(etp, -1).sum(dim=1).tolist()
        self.chunk_sizes = counts.flatten().tolist()  # received order: (source row, expert)
        rows = counts.shape[0]
        self.sort_by_expert = torch.arange(rows * n).view(rows, n).t().flatten().tolist()
        self.sorted_chunk_sizes = counts.t().flatten().tolist()  # (expert, source row)
        self.restore_order = torch.arange(rows * n).view(n, rows).t().flatten().tolist()
        self.tokens_per_expert = counts.sum(dim=0).cpu()  # [n]

    def dispatch_preprocess(self, hidden_states: Tensor, routing_map: Tensor, probs: Tensor):
        """[s, b, h] -> rows grouped by (global) expert [sum(map), h] and their probs."""
        self.hidden_shape = hidden_states.shape
        hidden_states = hidden_states.reshape(-1, self.hidden_shape[-1])
        self.tokens_shape = hidden_states.shape
        if self.dropless_local:
            permuted, permuted_probs, self.tokens_per_expert, self.sorted_indices = (
                permute_dropless(hidden_states, routing_map, probs, self.topk)
            )
            return permuted, permuted_probs
        self._count(routing_map)
        if self.shared_experts is not None:
            self.shared_experts.pre_forward_comm(hidden_states.view(self.hidden_shape))
        permuted, permuted_probs, self.sorted_indices = permute(hidden_states, routing_map, probs)
        return permuted, permuted_probs

    def token_dispatch(self, hidden_states: Tensor, probs: Tensor):
        """All-to-all over EP (shared experts' fc1 meanwhile), then all-gather over expert TP."""
        if self.ep_size > 1 and self.shared_experts is not None:
            wait_tokens = all_to_all_async(
                self.ep_group, hidden_states, self.output_splits, self.input_splits
            )
            wait_probs = all_to_all_async(
                self.ep_group, probs, self.output_splits, self.input_splits
            )
            self.shared_experts.linear_fc1_forward_and_act()
            hidden_states, probs = wait_tokens(), wait_probs()
        elif self.ep_size > 1:
            hidden_states = all_to_all(
                self.ep_group, hidden_states, self.output_splits, self.input_splits
            )
            probs = all_to_all(self.ep_group, probs, self.output_splits, self.input_splits)
        if self.tp_size > 1:
            hidden_states = gather_from_sequence_parallel_region(
                hidden_states, group=self.tp_group, output_split_sizes=self.output_splits_tp
            )
            probs = gather_from_sequence_parallel_region(
                probs, group=self.tp_group, output_split_sizes=self.output_splits_tp
            )
        return hidden_states, probs

    def dispatch_postprocess(self, hidden_states: Tensor, probs: Tensor):
        """Regroup the received chunks by local expert -> ([N, h], counts [n], probs [N])."""
        if self.dropless_local:  # one rank: already grouped by expert
            return hidden_states, self.tokens_per_expert, probs
        if self.num_local_experts > 1 and len(self.chunk_sizes) > self.num_local_experts:
            hidden_states = sort_chunks_by_idxs(
                hidden_states, self.chunk_sizes, self.sort_by_expert
            )
            probs = sort_chunks_by_idxs(probs, self.chunk_sizes, self.sort_by_expert)
        return hidden_states, self.tokens_per_expert, probs

    def combine_preprocess(self, expert_output: Tensor) -> Tensor:
        """Back to received order; reduce-scatter the expert-TP partial sums."""
        if self.dropless_local:
            return expert_output
        if self.num_local_experts > 1 and len(self.chunk_sizes) > self.num_local_experts:
            expert_output = sort_chunks_by_idxs(
                expert_output, self.sorted_chunk_sizes, self.restore_order
            )
        if self.tp_size > 1:
            expert_output = reduce_scatter_to_sequence_parallel_region(
                expert_output, group=self.tp_group, input_split_sizes=self.output_splits_tp
            )
        return expert_output

    def token_combine(self, hidden_states: Tensor) -> Tensor:
        """All-to-all back over EP (shared experts' fc2 meanwhile) and sum each token's k
        expert outputs -> [T, h]."""
        if self.ep_size > 1 and self.shared_experts is not None:
            wait = all_to_all_async(
                self.ep_group, hidden_states, self.input_splits, self.output_splits
            )
            self.shared_experts.linear_fc2_forward()
            self.shared_experts.post_forward_comm()
            hidden_states = wait()
        elif self.ep_size > 1:
            hidden_states = all_to_all(
                self.ep_group, hidden_states, self.input_splits, self.output_splits
            )
        if self.dropless_local:
            return unpermute_dropless(hidden_states, self.sorted_indices, self.topk)
        return unpermute(hidden_states, self.sorted_indices, self.tokens_shape)

    def combine_postprocess(self, hidden_states: Tensor) -> Tensor:
        """[T, h] -> [s, b, h], plus the overlapped shared experts' output when set."""
        output = hidden_states.view(self.hidden_shape)
        if self.shared_experts is not None:
            output = output + self.shared_experts.get_output()
        return output
