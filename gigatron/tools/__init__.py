"""Command-line tools (`gigatron preprocess`, `gigatron merge`, ...), one module each."""
