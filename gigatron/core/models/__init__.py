"""gigatron.core.models: model families built from specs (mirrors megatron.core.models)."""
