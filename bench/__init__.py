"""gigatron's benchmarks: scripts grouped by what they measure (bench/README.md is the index).

Run a script by its path from the repo root (`python bench/gpt/bench_gpt.py ...`, or under
torchrun). Each script puts the repo root on `sys.path` once, so `gigatron` and the other bench
modules import without an install, always by their full name (`bench._lib.args`,
`bench.gpt.bench_gpt`). Not part of the gigatron package (pyproject ships `gigatron*` only).
"""
