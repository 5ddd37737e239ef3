"""Which transformer layers each pipeline stage (and virtual chunk) builds: pure arithmetic.

Mirrors `get_num_layers_to_build` (megatron.core.transformer.transformer_block) and
`get_transformer_layer_offset` (megatron.core.transformer.transformer_layer) for the layouts
without `pipeline_model_parallel_layout`:

- even split: L / pp layers per stage; with vp virtual chunks, chunk c on rank r holds layers
  [(c * pp + r) * L / (pp * vp), ...) (16 layers, pp 4, vp 2: rank 0 = layers 0-1 and 8-9);
- uneven: `num_layers_in_first_pipeline_stage` / `..._last_...` fix the first / last stage; the
  remaining layers split evenly over the other stages; with vp each stage's count is split evenly
  over its chunks and chunk c of every stage comes before chunk c + 1 of any stage;
- `account_for_embedding_in_pipeline_split` / `..._loss_...` count the embedding / loss as one
  layer of the first / last virtual stage (even split only).

`layer_split` returns every (rank, chunk) -> (offset, count) so tests can check the whole layout.
"""

from __future__ import annotations


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _per_stage(num_layers, pp, first, last, account_embedding, account_loss) -> list[int]:
    """Transformer layers of each pipeline stage (all virtual chunks together)."""
    if first is None and last is None:
        total = num_layers + int(account_embedding) + int(account_loss)
        _check(
            total % pp == 0,
            f"num_layers ({num_layers}"
            + (" + 1 embedding" if account_embedding else "")
            + (" + 1 loss" if account_loss else "")
            + f") must be divisible by pipeline_model_parallel_size ({pp})",
        )
        return [total // pp] * pp
    _check(
        not (account_embedding or account_loss),
        "account_for_embedding/loss_in_pipeline_split cannot be combined with "
        "num_layers_in_first/last_pipeline_stage",
    )
    middle_stages = pp - (first is not None) - (last is not None)
    middle_layers = num_layers - (first or 0) - (last or 0)
    _check(middle_layers >= 0, f"num_layers ({num_layers}) < layers fixed for the first/last stage")
    if middle_stages > 0:
        _check(
            middle_layers % middle_stages == 0,
            f"the {middle_layers} layers left after num_layers_in_first_pipeline_stage ({first}) "
            f"and num_layers_in_last_pipeline_stage ({last}) must be divisible by the "
            f"{middle_stages} remaining pipeline stages",
        )
        per_middle = middle_layers // middle_stages
    else:
        _check(
            middle_layers == 0,
            f"num_layers ({num_layers}) must equal num_layers_in_first_pipeline_stage ({first}) "
            f"+ num_layers_in_last_pipeline_stage ({last}) with {pp} stages",
        )
        per_middle = 0
    counts = [per_middle] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts


def layer_split(
    num_layers: int,
    pp_size: int,
    vp_size: int | None = None,
    *,
    num_layers_in_first_pipeline_stage: int | None = None,
    num_layers_in_last_pipeline_stage: int | None = None,
    account_for_embedding_in_pipeline_split: bool = False,
    account_for_loss_in_pipeline_split: bool = False,
) -> dict[tuple[int, int], tuple[int, int]]:
    """(pp_rank, vp_stage) -> (first global layer index, number of layers) for every chunk.

    Embedding / loss "layers" (account_for_*) take a slot but are not transformer layers, so the
    first (last) virtual stage builds one layer fewer and later offsets shift by one.
    """
    vp = vp_size or 1
    account_embedding = account_for_embedding_in_pipeline_split
    account_loss = account_for_loss_in_pipeline_split
    stage_counts = _per_stage(
        num_layers,
        pp_size,
        num_layers_in_first_pipeline_stage,
        num_layers_in_last_pipeline_stage,
        account_embedding,
        account_loss,
    )
    for rank, count in enumerate(stage_counts):
        _check(
            count % vp == 0,
            f"layers on pipeline stage {rank} ({count}) must be divisible by "
            f"virtual_pipeline_model_parallel_size ({vp})",
        )
    split, slot = {}, 0  # slot: position in the embedding/loss-inclusive numbering
    for chunk in range(vp):
        for rank in range(pp_size):
            n = stage_counts[rank] // vp
            build = n
            offset = slot
            if account_embedding:
                offset -= 1 if slot > 0 else 0
                build -= 1 if (rank, chunk) == (0, 0) else 0
            if account_loss and (rank, chunk) == (pp_size - 1, vp - 1):
                build -= 1
            _check(build >= 0, f"not enough layers for virtual stage (rank {rank}, chunk {chunk})")
            split[(rank, chunk)] = (offset, build)
            slot += n
    return split


def _check_pp_size(config, parallel_state) -> None:
    """The config's pipeline size must be parallel_state's: the layer split and the stage this
    rank builds both come from it (tutorials often leave it at 1 in the config)."""
    pp_world = parallel_state.get_pipeline_model_parallel_world_size()
    pp = config.pipeline_model_parallel_size
    if pp == pp_world or (pp_world == 1 and not parallel_state.model_parallel_is_initialized()):
        return
    raise ValueError(
        f"parallel_state was initialized with pipeline_model_parallel_size={pp_world} but the "
        f"TransformerConfig has pipeline_model_parallel_size={pp}: pass "
        f"TransformerConfig(..., pipeline_model_parallel_size={pp_world}, pipeline_dtype=<the "
        "params' dtype, e.g. torch.float32>) and build each stage's model with "
        "pre_process=parallel_state.is_pipeline_first_stage(), "
        "post_process=parallel_state.is_pipeline_last_stage()"
    )


def _from_config(config, vp_stage, pp_rank):
    if getattr(config, "pipeline_model_parallel_layout", None) is not None:
        raise ValueError("pipeline_model_parallel_layout is not supported by gigatron")
    if pp_rank is None:
        from gigatron.core import parallel_state

        _check_pp_size(config, parallel_state)
        pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    vp = config.virtual_pipeline_model_parallel_size
    if vp is not None and vp_stage is None:
        raise ValueError(
            f"vp_stage must be given when virtual_pipeline_model_parallel_size ({vp}) is set"
        )
    split = layer_split(
        config.num_layers,
        config.pipeline_model_parallel_size,
        vp,
        num_layers_in_first_pipeline_stage=config.num_layers_in_first_pipeline_stage,
        num_layers_in_last_pipeline_stage=config.num_layers_in_last_pipeline_stage,
        account_for_embedding_in_pipeline_split=config.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=config.account_for_loss_in_pipeline_split,
    )
    return split[(pp_rank, vp_stage or 0)]


def get_num_layers_to_build(config, vp_stage: int | None = None, pp_rank: int | None = None):
    """Transformer layers this stage (chunk `vp_stage`) builds; pp_rank defaults to this rank."""
    return _from_config(config, vp_stage, pp_rank)[1]


def get_transformer_layer_offset(config, vp_stage: int | None = None, pp_rank: int | None = None):
    """Global index of this stage's (chunk's) first transformer layer."""
    return _from_config(config, vp_stage, pp_rank)[0]
