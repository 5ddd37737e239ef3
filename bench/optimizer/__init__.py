"""The AdamW step alone (bench_adamw.py), the training optimizer's host time
(bench_optimizer_host.py), and the benchmark-only optimizers they measure: speed experiments that
did not become defaults (gigatron-only, no Megatron counterpart). Nothing in gigatron imports them;
what did become a default lives in the core (the distributed optimizer's flat fused Adam step,
`gigatron/core/optimizer/_flat_adam_step.py`).

- `flat_adamw.FlatAdamW`: AdamW over DDP's flat gradient buffers, one compiled pass per buffer
  (bench_gpt.py `--optimizer flat|flat-overlap`).
- `multi_tensor_adamw.MultiTensorAdamW`: torch AdamW's update as one Triton launch over all
  tensors, kernel in `_triton_adamw.py` (bench_gpt.py `--optimizer multi-tensor`).
"""
