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
    megatron               the `megatron.core` / `megatron.training` import alias and launcher
    _cuda_hint             the launcher's hint for CUDA calls on a machine without CUDA

The whole package is the ground floor: no module here imports gigatron's (`megatron` reaches
gigatron's modules only by name, through `importlib`, when a `megatron.*` import asks for one),
so `gigatron.core` may import the public ones. Compatibility that needs the training library
lives beside it: `gigatron.training.compat_flags` (Megatron-LM flags: aliases, accepted no-ops,
refused values) and `gigatron.training.legacy_moe_checkpoint` (gigatron's own pre-issue-29 MoE
checkpoint layouts -> today's).

This `__init__` imports nothing, so importing a leaf never pulls in anything else.
"""
