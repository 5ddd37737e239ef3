"""Compose `tiny_stories.txt`: short, plain English stories from a small seeded grammar.

The text is original (generated here, no third-party source) and exists so `make train` has a
real corpus with no download. Run `python -m gigatron.data._compose_corpus` to regenerate the
committed file; the output is deterministic (Python's `random` with a fixed seed). One story per
line, so `gigatron preprocess --input tiny_stories.txt` sees one document per story.
"""

from __future__ import annotations

import os
import random

NAMES = [
    "Anna",
    "Ben",
    "Clara",
    "Daniel",
    "Ella",
    "Felix",
    "Grace",
    "Henry",
    "Iris",
    "Jack",
    "Kate",
    "Leo",
    "Mia",
    "Noah",
    "Olive",
    "Peter",
    "Rose",
    "Sam",
    "Tess",
    "Will",
]
PET_NAMES = ["Biscuit", "Pepper", "Maple", "Button", "Shadow", "Clover", "Pip", "Juniper"]
ANIMALS = [
    "dog",
    "cat",
    "fox",
    "owl",
    "rabbit",
    "horse",
    "duck",
    "goat",
    "mouse",
    "bear",
    "frog",
    "sparrow",
    "turtle",
    "squirrel",
    "pony",
]
PLACES = [
    "the old mill",
    "the river bank",
    "the village square",
    "the top of the hill",
    "the edge of the forest",
    "the little harbour",
    "the bakery on the corner",
    "the school garden",
    "the apple orchard",
    "the quiet library",
    "the wooden bridge",
    "the market",
    "the lighthouse",
    "the meadow behind the farm",
    "the train station",
]
THINGS = [
    "a red kite",
    "a brass key",
    "a blue umbrella",
    "a loaf of bread",
    "a paper boat",
    "a lantern",
    "a map of the town",
    "a jar of honey",
    "a wool hat",
    "a small bell",
    "a basket of plums",
    "a wooden flute",
    "a silver coin",
    "a book of songs",
    "a green scarf",
]
WEATHER = [
    "The sun was warm and the sky was clear.",
    "A soft rain was falling on the roofs.",
    "The wind was cold and it carried the smell of the sea.",
    "Snow covered the fields.",
    "Grey clouds hung low over the valley.",
    "It was a bright, still morning.",
    "The evening light turned the water gold.",
    "Fog rolled in from the hills.",
]
FEELINGS = ["happy", "worried", "curious", "tired", "proud", "surprised", "calm", "brave"]
ADJ = ["small", "old", "quiet", "kind", "clever", "shy", "cheerful", "patient", "busy"]
VERBS_PAST = [
    "walked to",
    "ran to",
    "hurried to",
    "wandered over to",
    "climbed up to",
    "cycled to",
]
TIMES = ["One morning", "Early on Sunday", "Late one afternoon", "In the spring", "That winter"]
SAYINGS = [
    "We should help each other.",
    "Let us look once more.",
    "I think I know the way.",
    "It is better to ask than to guess.",
    "Tomorrow will be a good day.",
    "Nothing is lost if we remember where we put it.",
    "Slow steps still reach the top.",
]
ENDINGS = [
    "In the end, everyone went home with a smile.",
    "From that day on, they met there every week.",
    "And the town was a little brighter than before.",
    "They laughed about it for many years.",
    "It was the best day of the whole summer.",
    "That night, {a} slept well and dreamed of {place}.",
]


def _sentence_pool(rng: random.Random, a: str, b: str, animal: str, thing: str, place: str):
    adj = rng.choice(ADJ)
    feel = rng.choice(FEELINGS)
    return [
        f"{a} was {'an' if adj[0] in 'aeiou' else 'a'} {adj} child who lived near {place}.",
        f"{a} had a {animal} called {rng.choice(PET_NAMES)}, who followed {a} everywhere.",
        f"{rng.choice(WEATHER)}",
        f"{rng.choice(TIMES)}, {a} {rng.choice(VERBS_PAST)} {place} with {thing}.",
        f"There {a} met {b}, who looked {feel}.",
        f'"What is wrong?" asked {a}. "I lost {thing}," said {b}.',
        f'"{rng.choice(SAYINGS)[:-1]}," said {a}.',
        "They searched behind the trees, under the benches and along the path.",
        f"The {animal} sniffed the ground and then barked at a pile of leaves.",
        f"Under the leaves they found {thing}, a little wet but not broken.",
        f"{b} counted {rng.randint(2, 12)} steps back to {rng.choice(PLACES)}.",
        f"On the way they shared {rng.choice(THINGS)} and talked about the weather.",
        f"{a} felt {rng.choice(FEELINGS)}, and {b} felt {rng.choice(FEELINGS)} too.",
    ]


def compose_story(rng: random.Random) -> str:
    a, b = rng.sample(NAMES, 2)
    animal, thing, place = rng.choice(ANIMALS), rng.choice(THINGS), rng.choice(PLACES)
    pool = _sentence_pool(rng, a, b, animal, thing, place)
    opening, middle = pool[:3], pool[3:]
    keep = sorted(rng.sample(range(len(middle)), rng.randint(6, len(middle))))
    body = opening + [middle[i] for i in keep]  # a subset, in story order
    ending = rng.choice(ENDINGS).format(a=a, place=place)
    return " ".join(body + [ending])


def compose(num_bytes: int = 300_000, seed: int = 1234) -> str:
    rng = random.Random(seed)
    lines, size = [], 0
    while size < num_bytes:
        story = compose_story(rng)
        lines.append(story)
        size += len(story) + 1
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_stories.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(compose())
    print(f"wrote {path}")
