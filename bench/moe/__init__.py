"""The MoE GPT step, SequentialMLP vs GroupedMLP (bench_moe.py), and the MoE targets from a results
file (compare_moe.py).
"""
