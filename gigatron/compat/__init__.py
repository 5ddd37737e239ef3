"""Megatron compatibility, in one place: what gigatron does with Megatron names it lacks.

The core modules read like the math; where they must consult compatibility (a config reporting a
Megatron-only field, a module naming the class a tutorial meant) they make one named call into
this package. docs/compat.md is generated from these modules (`scripts/gen_compat.py`).

    megatron_only_fields   Megatron config fields gigatron refuses at a non-default value
    errors                 exceptions that are AssertionError (Megatron's) and RuntimeError /
                           ValueError (gigatron's) at once
    missing_names          names tutorials use that Megatron never had -> what to use
                           (config fields, MoE class names; no caller-frame inspection)
    loss_reports           the schedule's list of loss reports, with misuse errors
                           (`.backward()`, GradScaler, `/ accumulation_steps`)
    training_args          Megatron-LM flags: aliases, accepted no-ops, refused values
    legacy_moe_checkpoint  gigatron's own pre-issue-29 MoE checkpoint layouts -> today's
    megatron               the `megatron.core` / `megatron.training` import alias and launcher
    _cuda_hint             the launcher's hint for CUDA calls on a machine without CUDA

Layering (bottom to top; an import only ever points down, never in a circle):

1. Leaves: `megatron_only_fields`, `missing_names`, `loss_reports`, `errors`, `_cuda_hint`
   import nothing from gigatron. Any gigatron package may import the public ones
   (`gigatron.core` does); `_cuda_hint` only `compat.megatron`.
2. `gigatron.core`: may import the leaves, no other compat module.
3. Over core: `training_args` and `legacy_moe_checkpoint` may import `gigatron.core` and the
   leaves; only `gigatron.training` (and `compat.megatron`) may import them.
4. `gigatron.training`: may import layers 1-3.
5. Top: `megatron` may import anything; nothing in gigatron imports it.

This `__init__` imports nothing, so importing a leaf never pulls in the layers above it.
"""
