"""A synthetic multi-user memory for benchmarks: templates x names x topics, in sessions of ordered turns.

Deterministic for a seed; 20 users, so every query runs under a scope that holds 1/20 of the facts.
"""

from __future__ import annotations

import itertools
import random
from datetime import datetime, timedelta

from pgr_core import Fact, Scope

USERS = [
    "alice", "bob", "carmen", "dev", "elif", "farid", "grace", "hiro", "ines", "jonas",
    "kofi", "lena", "marco", "nadia", "omar", "priya", "quinn", "rosa", "sven", "tara",
]  # fmt: skip
TOPICS = [
    ("knee", "my knee injury from skiing"), ("physio", "the physio appointments on Fridays"),
    ("bus", "taking the number 9 bus since I sold the car"), ("rent", "the rent going up again"),
    ("class", "the bookkeeping class on Tuesday evenings"), ("football", "five-a-side football with Sam"),
    ("sleep", "not sleeping well before early shifts"), ("train", "train trips to see my sister"),
    ("diet", "cooking vegetarian without nuts"), ("budget", "saving for a new laptop"),
    ("garden", "the allotment tomatoes"), ("dog", "walking the neighbour's dog"),
    ("guitar", "guitar lessons on Saturday mornings"), ("work", "the late meetings at work"),
    ("swim", "swimming at the leisure centre"), ("mum", "visiting mum in hospital"),
    ("bike", "fixing my bike's gears"), ("exam", "the accounting exam in June"),
    ("holiday", "a cheap holiday in Portugal"), ("allergy", "hay fever in May"),
    ("car", "maybe buying a used car"), ("friends", "pub quiz with old friends"),
    ("coffee", "cutting down on coffee"), ("flat", "the damp in my flat"), ("choir", "singing in a choir"),
]  # fmt: skip
TEMPLATES = [
    "I keep thinking about {t}", "Honestly {t} is stressing me out", "Quick update on {t}",
    "My friend {n} asked me about {t}", "{n} said something about {t} today", "I made a plan around {t}",
    "Remind me later about {t}", "It turns out {t} costs more than I thought", "I'm excited about {t}",
    "Not sure what to do about {t}", "{t} took most of my weekend", "I told {n} I'd sort out {t}",
    "Still no news on {t}", "I finally dealt with {t}", "Can't stop worrying about {t}",
    "{t} went better than expected", "I should ask {n} for help with {t}", "Thinking of giving up {t}",
    "{t} clashes with my evenings", "Wrote down notes on {t}",
]  # fmt: skip
QUERIES = [
    "Should I join a soccer league this summer?", "Can I afford a weekend away next month?",
    "What should I cook for friends on Saturday?", "Is it a good time to start running again?",
    "Should I take an evening course in the autumn?", "How do I get to the wedding in Leeds?",
    "Should I adopt a dog?", "Can I take on extra shifts at work?", "What should I do this weekend?",
    "Should I buy a new bike?", "Is it worth moving flats this year?", "How can I sleep better?",
    "Should I sign up for a half marathon?", "What present should I get my mum?",
    "Can I fit a language class into my week?", "Should I go on holiday in May?",
    "How should I prepare for my exam?", "Should I sell my guitar?", "Can I host the pub quiz?",
    "Should I start a vegetable garden?",
]  # fmt: skip
TURNS_PER_SESSION = 10


def make_facts(n: int, seed: int = 13) -> list[Fact]:
    rng = random.Random(seed)
    combos = list(itertools.product(TEMPLATES, TOPICS))
    facts = []
    for i in range(n):
        user = USERS[i % len(USERS)]
        k = i // len(USERS)  # the user's k-th fact
        template, (_, topic) = combos[(k * 7 + USERS.index(user) * 31) % len(combos)]
        text = template.format(t=topic, n=rng.choice(USERS).title()) + f" (#{k})"
        session, position = divmod(k, TURNS_PER_SESSION)
        facts.append(
            Fact(
                id=f"{user}-{k}",
                text=text[0].upper() + text[1:],
                scope=Scope(user_id=user),
                type="turn",
                date=datetime(2024, 1, 1) + timedelta(days=session * 3, minutes=position),
                session_id=f"{user}-s{session}",
                position=position,
            )
        )
    return facts
