"""The data pipeline against megatron-core: index building, blending, preprocessing (bench_data.py);
blending indices alone (bench_blend.py).
"""
