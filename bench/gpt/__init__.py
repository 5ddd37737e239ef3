"""One GPT training step in any layout (bench_gpt.py), its layer GEMMs alone, the anchor's kernel
profile, the chunked cross entropy's matmul count.
"""
