"""LanguageModule: embedding/output tying and the LM loss shared by language models."""
