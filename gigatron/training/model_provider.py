"""`model_provider(model_builder, ...)`: the model of this run's flags (Megatron-LM's
model_provider.py).

The training loop calls a provider with `pre_process`, `post_process` (and `vp_stage`);
Megatron's programs bind a builder to this one (`partial(model_provider, gpt_builder)`), which
reads the parsed flags and hands them to the builder.
"""

from __future__ import annotations

from collections.abc import Callable

from gigatron.training.global_vars import get_args


def model_provider(
    model_builder: Callable,
    pre_process: bool = True,
    post_process: bool = True,
    vp_stage: int | None = None,
    config=None,
    pg_collection=None,
):
    """`model_builder(args, pre_process, post_process, vp_stage, config=, pg_collection=)` over
    the parsed flags (`get_args()`)."""
    return model_builder(
        get_args(), pre_process, post_process, vp_stage, config=config, pg_collection=pg_collection
    )
