"""`gigatron estimate` against measurement: its calibration table (calibrate.py), bench_gpt's step
(estimate_check.py, estimate_memory_cpu.py) and pretrain_gpt's run (estimate_train_check.py,
live_bytes_run.py).
"""
