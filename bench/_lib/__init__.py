"""Helpers the benchmark scripts share: the bench model's configs and flags, CUDA timing, GPU power
sampling, kernel profiles.
"""
