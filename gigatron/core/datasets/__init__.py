"""gigatron.core.datasets: Megatron's indexed token files, GPT datasets and blending (NumPy)."""
