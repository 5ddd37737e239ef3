"""A tiny corpus and WordPiece vocabulary for the BERT and T5 tutorial (bert_t5_pretraining.py).

    python examples/tutorials/make_wordpiece_corpus.py data/
    gigatron preprocess --input data/corpus.jsonl --output-prefix data/corpus \\
        --tokenizer-type BertWordPieceLowerCase --vocab-file data/vocab.txt

writes data/corpus.jsonl (one JSON document per line, its "text" a list of sentences) and
data/vocab.txt (BERT's special tokens, then one word or "##" word piece per line). A document
given as a list of sentences is stored as one sequence per sentence, which BERT's next-sentence
head and T5's span corruption need; plain-text documents need `--split-sentences` (NLTK) for
that. With your own text, train a vocabulary instead (e.g. Hugging Face `tokenizers`'
BertWordPieceTokenizer).
"""

import argparse
import json
import os
import random

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SUBJECTS = ["the cat", "a dog", "the bird", "my friend", "the teacher", "a child"]
VERBS = ["sees", "likes", "finds", "follows", "paints", "calls"]
OBJECTS = ["the tree", "a house", "the river", "the garden", "a boat", "the hill"]
PLACES = ["in the morning", "at night", "near the lake", "after lunch", "in the rain"]


def sentence(rng: random.Random) -> str:
    words = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)]
    if rng.random() < 0.5:
        words.append(rng.choice(PLACES))
    if rng.random() < 0.3:  # a plural: "cats" -> "cat" "##s" in the vocabulary
        words[0] = words[0].replace("the ", "two ").replace("a ", "two ").replace("my ", "two ")
        words[0] += "s"
        words[1] = words[1][:-1]
    return " ".join(words).capitalize() + "."


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--documents", type=int, default=400)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    rng = random.Random(0)
    with open(os.path.join(args.out_dir, "corpus.jsonl"), "w") as f:
        for _ in range(args.documents):
            text = [sentence(rng) for _ in range(rng.randint(2, 6))]
            f.write(json.dumps({"text": text}) + "\n")
    words = {"two", "##s", "."}
    for phrase in SUBJECTS + VERBS + OBJECTS + PLACES:
        words.update(phrase.split())
    words.update(verb[:-1] for verb in VERBS)  # "see" of "two cats see ..."
    with open(os.path.join(args.out_dir, "vocab.txt"), "w") as f:
        f.write("\n".join(SPECIALS + sorted(words)) + "\n")
    print(f"wrote {args.out_dir}/corpus.jsonl ({args.documents} documents) and vocab.txt")


if __name__ == "__main__":
    main()
