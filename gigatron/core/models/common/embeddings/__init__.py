"""Embeddings shared by the model families."""
