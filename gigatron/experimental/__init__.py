"""Speed experiments that did not become defaults (gigatron-only, no Megatron counterpart).

Kept for the benchmarks that measure them (`bench/bench_adamw.py`, `bench/bench_gpt.py
--optimizer flat|flat-overlap|multi-tensor`) and their parity tests; nothing in `gigatron.core` or
`gigatron.training` imports this package. What did become a default lives in the core (the
distributed optimizer's flat fused Adam step, `gigatron/core/optimizer/_flat_adam_step.py`).

- `flat_adamw.FlatAdamW`: AdamW over DDP's flat gradient buffers, one compiled pass per buffer.
- `multi_tensor_adamw.MultiTensorAdamW`: torch AdamW's update as one Triton launch over all
  tensors (kernel in `_triton_adamw.py`).
"""
