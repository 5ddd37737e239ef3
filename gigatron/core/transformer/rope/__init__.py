"""Rotary position embeddings, which the attention modules apply to q/k.

Megatron keeps these under `megatron.core.models.common.embeddings`, above the transformer that
uses them; here they sit in the transformer's own folder so imports point down only, and the
Megatron paths (`gigatron.core.models.common.embeddings.rope_utils`, `.rotary_pos_embedding`,
`.yarn_rotary_pos_embedding`) name these very modules (same objects, for `monkeypatch` too).
"""
