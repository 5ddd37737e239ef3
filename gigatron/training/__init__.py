"""gigatron.training: the parts of `megatron.training` that users script against."""
