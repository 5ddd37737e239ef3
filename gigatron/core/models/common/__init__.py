"""Pieces shared by the model families (embeddings, LanguageModule, vocab padding)."""
