"""A tiny offline chat tokenizer (word-level, built with `tokenizers`, a Jinja chat template with
special tokens between turns) and JSONL conversations over its words, for the SFT tests."""

import json

WORDS = [f"w{i}" for i in range(40)]
SPECIALS = ["<unk>", "<pad>", "<s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> "
    "{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def make_chat_tokenizer(path: str) -> int:
    """Save a PreTrainedTokenizerFast with TEMPLATE to `path`; returns its vocabulary size."""
    import tokenizers
    import transformers

    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in SPECIALS])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
        eos_token="<|end|>", chat_template=TEMPLATE,
    )  # fmt: skip
    fast.save_pretrained(path)
    return len(vocab)


def conversation(rng, turns: int = 1) -> list[dict]:
    """[system, (user, assistant) * turns] with a few random words each."""

    def words(lo, hi):
        return " ".join(rng.choice(WORDS[:20] if lo else WORDS[20:], int(rng.integers(lo, hi))))

    out = [{"role": "system", "content": words(1, 3)}]
    for _ in range(turns):
        out.append({"role": "user", "content": words(2, 5)})
        # answers repeat a fixed pattern so a few steps of training lower their loss
        out.append({"role": "assistant", "content": "w20 w21 w22 " + words(0, 2)})
    return out


def write_jsonl(path: str, lines: list[list[dict]]) -> str:
    with open(path, "w") as f:
        for messages in lines:
            f.write(json.dumps({"messages": messages}) + "\n")
    return path
