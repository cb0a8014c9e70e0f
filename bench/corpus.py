"""The evaluation corpus of bench/minilm.py: deterministic, varied English sentences.

18 topics, each with its own nouns, verbs (base form) and adjectives (about 515 distinct content
words in all), 14 clause templates, 1-6 clauses per sentence joined by connectives, 5-60 words,
some numbers, names, questions and all-caps rows. Sentences of one topic are semantically close and
those of different topics far apart, so nearest-neighbour agreement measures the embedding, not
near-ties between permutations of a few words (the earlier 46-word generator had a top-1/top-2
margin < 6.5e-4 for 2% of its sentences).

The compiler's GPTQ calibration set (services/compiler/src/anvil_compiler/calibration/) is
hand-written prose that shares neither templates nor word lists with this module.
"""

from __future__ import annotations

import random

__all__ = ["CORPUS", "TOPICS", "sentences"]

CORPUS = "corpus-v2"  # bump when sentences() changes; bench rows of other corpora are dropped

# topic -> (nouns, verbs in base form, adjectives)
TOPICS: dict[str, tuple[str, str, str]] = {
    "cooking": (
        "soup onion garlic oven recipe kettle pastry butter saucepan spice lentil dough pepper skillet "
        "broth noodle",
        "bake stir chop simmer roast season knead taste peel whisk",
        "crispy salty tender spicy savory fragrant",
    ),
    "football": (
        "goalkeeper striker referee stadium penalty league match defender tournament trophy coach "
        "corner whistle jersey midfield",
        "score tackle dribble defend kick cheer substitute celebrate",
        "offside unbeaten muddy decisive athletic relegated",
    ),
    "finance": (
        "mortgage dividend portfolio inflation bond investor budget loan currency auditor pension "
        "invoice shareholder bank ledger",
        "invest borrow repay audit hedge withdraw deposit forecast",
        "fiscal volatile profitable bankrupt quarterly liquid",
    ),
    "medicine": (
        "patient surgeon vaccine fever clinic nurse diagnosis prescription antibiotic wound "
        "stethoscope symptom ambulance pharmacist allergy",
        "diagnose treat vaccinate examine prescribe heal bandage operate",
        "chronic contagious painful sterile acute feverish",
    ),
    "software": (
        "compiler database server keyboard algorithm debugger repository laptop browser kernel "
        "password spreadsheet firewall router thread",
        "compile deploy debug install encrypt refactor download reboot",
        "buggy encrypted open-source deprecated parallel wireless",
    ),
    "travel": (
        "passport airport suitcase hostel itinerary ferry luggage visa tourist souvenir guidebook "
        "terminal backpack hotel customs",
        "book pack explore wander sightsee cancel board check",
        "exotic crowded scenic overnight delayed remote",
    ),
    "weather": (
        "thunderstorm drizzle forecast hurricane blizzard humidity rainbow fog frost drought breeze "
        "tornado hailstone cloud monsoon",
        "pour freeze thaw gust flood evaporate clear drift",
        "humid chilly overcast stormy foggy sunny",
    ),
    "music": (
        "orchestra melody guitar drummer choir concerto lyric saxophone piano conductor chord "
        "album rehearsal cello symphony",
        "compose rehearse strum hum improvise tune record perform",
        "melodic acoustic harmonic catchy jazzy rhythmic",
    ),
    "law": (
        "judge lawyer verdict jury contract witness courtroom appeal statute lawsuit defendant "
        "warrant testimony prosecutor treaty",
        "sue testify appeal acquit convict negotiate legislate enforce",
        "legal guilty binding constitutional criminal confidential",
    ),
    "biology": (
        "cell enzyme protein chromosome bacterium mitochondrion species fossil organism gene "
        "membrane virus predator habitat embryo",
        "evolve mutate digest replicate photosynthesize migrate adapt reproduce",
        "genetic microscopic extinct endangered cellular nocturnal",
    ),
    "astronomy": (
        "galaxy telescope comet asteroid nebula orbit satellite astronaut planet eclipse supernova "
        "meteor rocket observatory constellation",
        "orbit launch observe collide rotate explode land detect",
        "celestial lunar solar interstellar gravitational distant",
    ),
    "history": (
        "empire revolution dynasty castle treaty monarch archive battle pharaoh knight manuscript "
        "colony senate emperor parliament",
        "conquer rule abolish invade surrender crown rebel excavate",
        "medieval ancient colonial imperial feudal victorian",
    ),
    "education": (
        "teacher student exam classroom lecture homework diploma curriculum semester professor "
        "textbook scholarship library essay tutor",
        "teach study graduate enroll memorize grade lecture revise",
        "academic diligent elementary rigorous bilingual absent",
    ),
    "gardening": (
        "tulip compost shovel seedling greenhouse hedge orchard fertilizer lawn weed sunflower "
        "trowel vineyard pumpkin rosebush",
        "plant water prune harvest dig fertilize sow mow",
        "organic blooming leafy perennial fertile overgrown",
    ),
    "transport": (
        "truck bicycle tram highway engine tire motorcycle garage railway diesel bus pilot subway "
        "ferryboat helicopter",
        "drive park brake accelerate steer tow refuel commute",
        "electric rusty fast congested hybrid rural",
    ),
    "art": (
        "painter canvas sculpture gallery portrait brush museum mural easel sketch watercolor "
        "exhibition chisel mosaic curator",
        "paint sculpt sketch exhibit frame restore carve display",
        "abstract vivid surreal impressionist colorful minimalist",
    ),
    "home": (
        "grandmother toddler kitchen sofa blanket birthday chimney neighbor cousin laundry "
        "attic doorbell teapot puppy cradle",
        "vacuum cuddle clean visit babysit decorate cook nap",
        "cozy noisy spotless sleepy affectionate cluttered",
    ),
    "ocean": (
        "sailor harbor lighthouse anchor dolphin coral tide shipwreck whale reef submarine yacht "
        "seagull buoy captain",
        "sail dive anchor fish navigate swim row snorkel",
        "salty tidal stormy coastal underwater turquoise",
    ),
}
NAMES = [
    "Amara",
    "Bruno",
    "Chen",
    "Dmitri",
    "Elena",
    "Farah",
    "Gustavo",
    "Hana",
    "Ivan",
    "Jun",
    "Kwame",
    "Leila",
    "Mateo",
    "Nadia",
    "Oscar",
    "Priya",
]
TIMES = [
    "yesterday",
    "today",
    "at dawn",
    "last winter",
    "every Tuesday",
    "before midnight",
    "in 1998",
    "next spring",
]
PLACES = [
    "in Lisbon",
    "near the border",
    "on the north coast",
    "downtown",
    "in a small town",
    "at the old harbour",
]
CONNECT = [", and", ", but", " because", " although", ", so", "; meanwhile,", " while", ". Then"]


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _clause(rng: random.Random, topic: str) -> str:
    ns, vs, js = (s.split() for s in TOPICS[topic])
    n1, n2 = rng.sample(ns, 2)
    v, j, j2 = rng.choice(vs), rng.choice(js), rng.choice(js)
    who, place, num = rng.choice(NAMES), rng.choice(PLACES), rng.randint(2, 2026)
    return rng.choice(
        [
            f"the {j} {n1} will {v} the {n2} {place}",
            f"{who} tried to {v} {_a(j)} {n1}",
            f"we need to {v} the {n1} before the {n2} gets {j}",
            f"nobody knew how to {v} a {n1} like that",
            f"the {n1} and the {n2} were both {j}",
            f"{num} people came to {v} the {j2} {n1}",
            f"can you {v} the {n1} without the {n2}?",
            f"my {n1} is more {j} than your {n2}",
            f"{who} said the {n1} looked {j} {rng.choice(TIMES)}",
            f"please {v} the {n2} and leave the {n1} alone",
            f"there is {_a(j)} {n1} next to the {n2}",
            f"after {num} days, the {n1} began to {v}",
            f"why would anyone {v} {_a(j2)} {n2}?",
            f"the report about the {n1} mentions {num} {j} cases",
        ]
    )


def sentences(n: int, seed: int = 7) -> list[str]:
    """``n`` sentences of 5-60 words; the same (n, seed) gives the same list."""
    rng = random.Random(seed)
    topics = sorted(TOPICS)
    out = []
    for i in range(n):
        topic = rng.choice(topics)
        target = int(rng.triangular(5, 60, 14))
        text = _clause(rng, topic)
        while len(text.split()) < target:
            if rng.random() < 0.15:  # drift to another topic now and then
                topic = rng.choice(topics)
            text += f"{rng.choice(CONNECT)} {_clause(rng, topic)}"
        words = text.split()[:60]
        s = " ".join(words).rstrip(",;?")
        s = s[0].upper() + s[1:] + ("" if s.endswith("?") else rng.choice([".", ".", ".", "!", "..."]))
        out.append(s if i % 17 else s.upper())
    return out
