"""Context-parallel attention / GPT (bench_cp.py) and the sequence-parallel collectives alone and
beside a GEMM (bench_tp_comm.py).
"""
