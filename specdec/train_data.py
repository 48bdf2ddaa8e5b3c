"""Self-distillation data for EAGLE-3 heads, without torch.

What lives here: the prompt set (hand-written task templates x subjects, plus user turns the
target writes itself), the target's answers generated with specdec, the target's features for
each token (the residual stream entering three of its layers, what the head's ``fc`` reads) and
its top-k logits (the soft labels), stored in shards under a work directory; the draft
vocabulary (the most frequent answer tokens, with EAGLE-3's ``d2t``/``t2d``); and a
safetensors writer for the exported head. ``specdec.train_eagle3`` (torch) trains on the
shards; ``python -m specdec.train eagle3`` drives both.

A shard is a directory written under a temporary name and renamed when complete, so an
interrupted run resumes at the first missing shard:

    tokens.npy      int32 (N,)        every sequence's tokens, concatenated (prompt + answer)
    starts.npy      int64 (S + 1,)    sequence s is rows starts[s]:starts[s+1]
    answer.npy      int64 (S,)        where each sequence's answer begins (its prompt length)
    feats.npy       float16 (N, 3H)   cat(a_low, a_mid, a_high): the residual stream entering
                                      the three tapped layers at each token
    topk_ids.npy    int32 (N, K)      the target's K most probable next tokens at each token,
    topk_logits.npy float16 (N, K)    and their logits, best first (prompt rows: ids -1)
    meta.json       the shard's prompts, sampling settings and generation statistics
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import struct
import threading
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

# ---------------------------------------------------------------------------------------------
# Prompts. Hand-written task templates crossed with subjects, in the spirit of the categories a
# chat model is asked about (writing, role play, reasoning, maths, coding, extraction, STEM,
# humanities, translation, summarisation, question answering). None of them is taken from an
# evaluation set.

SUBJECTS = [
    "the water cycle", "volcanoes", "black holes", "photosynthesis", "the Roman Empire",
    "the French Revolution", "machine learning", "climate change", "the human heart",
    "honey bees", "the printing press", "electric cars", "the Moon landing", "coral reefs",
    "the stock market", "vaccines", "the Internet", "ancient Egypt", "renewable energy",
    "the immune system", "plate tectonics", "the Renaissance", "coffee", "chess",
    "the Great Wall of China", "recycling", "sleep", "meditation", "the Amazon rainforest",
    "quantum computers", "DNA", "the solar system", "the Olympic Games", "jazz music",
    "social media", "earthquakes", "the ocean tides", "bread baking", "gardening",
    "public libraries", "the Silk Road", "penguins", "rainbows", "the theory of evolution",
    "inflation", "cryptography", "bicycles", "the piano", "volunteering", "time management",
    "healthy eating", "the history of cinema", "robots", "deserts", "glaciers",
    "the Industrial Revolution", "democracy", "friendship", "public speaking", "space travel",
    "tea", "the Eiffel Tower", "mountain climbing", "electricity", "magnets", "sharks",
    "the Pyramids", "video games", "online privacy", "team sports", "wind turbines",
    "the human brain", "dinosaurs", "soap", "airplanes", "trains", "the periodic table",
    "gravity", "clouds", "money", "learning a new language", "remote work", "museums",
    "elephants", "the Arctic", "composting", "smartphones", "the Olympic marathon",
    "ancient Greece", "Shakespeare", "the Beatles", "origami", "photography", "recipes",
]

TASKS = [
    "Explain {s} to a ten-year-old.",
    "Write a short essay about {s}.",
    "What are the main benefits and drawbacks of {s}?",
    "Give me five interesting facts about {s}.",
    "Write a poem about {s}.",
    "Write a short story that involves {s}.",
    "Summarize the history of {s} in a few paragraphs.",
    "How does {s} work?",
    "What is the most common misconception about {s}?",
    "Write a blog post introducing {s} to beginners.",
    "Compare {s} with {t}.",
    "Create a quiz with three questions about {s}, with answers.",
    "Write a product description for something related to {s}.",
    "Pretend you are a tour guide and talk about {s}.",
    "List the key terms someone should know about {s}, with a one-line definition each.",
    "Write a persuasive paragraph arguing that everyone should learn about {s}.",
    "What questions do scientists still have about {s}?",
    "Write a dialogue between two friends discussing {s}.",
    "Give step-by-step instructions for a simple project about {s}.",
    "Describe {s} in exactly three sentences.",
    "Write an email to a teacher asking for advice on studying {s}.",
    "What would the world be like without {s}?",
    "Write a news headline and a short article about {s}.",
    "Outline a lesson plan about {s}.",
    "Write a haiku about {s}.",
]

MATH_TASKS = [
    "What is {a} times {b}?",
    "What is {a} plus {b}? Explain your steps.",
    "If a train travels {a} kilometres in {b} hours, what is its average speed?",
    "Solve for x: {a}x + {b} = {c}.",
    "A shop sells pencils at {b} cents each. How much do {a} pencils cost?",
    "What is {c} divided by {b}, rounded to two decimals?",
    "Is {c} a prime number? Explain.",
    "Tom has {a} apples and gives away {b}. How many are left?",
    "What is {b} percent of {c}?",
    "Convert {c} minutes into hours and minutes.",
]

CODE_TASKS = [
    "Write a Python function that {f}.",
    "Write a JavaScript function that {f}.",
    "Explain how to write a program that {f}.",
    "Write a C function that {f}, with comments.",
    "What is wrong with this approach: a loop that {f} using recursion only? Suggest a fix.",
]

CODE_FUNCS = [
    "reverses a string", "checks whether a number is prime", "computes the factorial of n",
    "sorts a list of numbers", "counts the vowels in a sentence", "finds the largest element "
    "of a list", "returns the Fibonacci numbers up to n", "checks if a word is a palindrome",
    "removes duplicates from a list", "converts Celsius to Fahrenheit", "merges two sorted "
    "lists", "computes the average of a list", "reads a file and counts its lines",
    "finds the greatest common divisor of two numbers", "capitalizes every word of a sentence",
    "computes the sum of the digits of a number", "implements binary search",
    "checks whether two strings are anagrams",
]

LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese"]

# Turns the target writes for the passage-based tasks (summarise, extract, translate).
PASSAGE_TASKS = [
    "Summarize the following text in two sentences:\n\n{p}",
    "Extract the main points of this text as a bulleted list:\n\n{p}",
    "Translate the following text into {lang}:\n\n{p}",
    "Rewrite the following text in simpler words:\n\n{p}",
    "Give this text a title and explain your choice:\n\n{p}",
    "What is the tone of the following text? Answer briefly.\n\n{p}",
]


def template_prompts(n: int, seed: int = 0) -> List[str]:
    """``n`` distinct user prompts from the hand-written templates, reproducibly shuffled."""
    rng = random.Random(seed)
    out: List[str] = []
    seen = set()
    tries = 0
    while len(out) < n and tries < 50 * n:
        tries += 1
        kind = rng.random()
        if kind < 0.70:
            s, t = rng.sample(SUBJECTS, 2)
            p = rng.choice(TASKS).format(s=s, t=t)
        elif kind < 0.85:
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            c = rng.randint(100, 999)
            p = rng.choice(MATH_TASKS).format(a=a, b=b, c=c)
        else:
            p = rng.choice(CODE_TASKS).format(f=rng.choice(CODE_FUNCS))
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def passage_prompts(passages: Sequence[str], n: int, seed: int = 0) -> List[str]:
    """Up to ``n`` prompts that ask for something about a passage (summaries, extraction,
    translation), from passages the target wrote earlier (cut to at most ~600 characters at a
    sentence end)."""
    rng = random.Random(seed)
    usable = [p for p in passages if len(p) >= 200]
    out = []
    for _ in range(min(n, len(usable))):
        p = rng.choice(usable)
        cut = p[:600]
        end = cut.rfind(". ")
        if end > 150:
            cut = cut[:end + 1]
        out.append(rng.choice(PASSAGE_TASKS).format(p=cut.strip(), lang=rng.choice(LANGUAGES)))
    return out


# Tasks over long contexts, as in the RAG and summarisation questions users bring (hundreds to
# thousands of tokens of documents): {docs} is several passages the target wrote, joined.
LONG_TASKS = [
    "Summarize the following document in a few sentences:\n\n{docs}",
    "Write a short abstract of the following text:\n\n{docs}",
    "Extract the key facts from this text as a bulleted list:\n\n{docs}",
    "{docs}\n\nWhat are the main topics of the text above? Answer briefly.",
    "Read the documents below and answer the question after them.\n\n{docs}\n\n"
    "Question: What do these documents have in common?",
    "Use the documents below to answer.\n\n{docs}\n\nQuestion: Which document is the most "
    "useful for a beginner, and why?",
]


def long_passage_prompts(passages: Sequence[str], n: int, seed: int = 0,
                         min_chars: int = 1500, max_chars: int = 4000) -> List[str]:
    """``n`` prompts over long contexts: distinct passages the target wrote, joined (as
    numbered documents in half of them) until a length drawn from [min_chars, max_chars], with
    a task about them (``LONG_TASKS``). Empty when fewer than two passages are usable."""
    rng = random.Random(seed)
    usable = sorted({p.strip() for p in passages if len(p.strip()) >= 200})
    if len(usable) < 2:
        return []
    out = []
    for _ in range(n):
        want = rng.randint(min_chars, max_chars)
        order = rng.sample(usable, len(usable))
        docs, size = [], 0
        while order and (size < want or len(docs) < 2):
            docs.append(order.pop())
            size += len(docs[-1])
        if rng.random() < 0.5:
            docs = [f"Document {i + 1}:\n{d}" for i, d in enumerate(docs)]
        out.append(rng.choice(LONG_TASKS).format(docs="\n\n".join(docs)))
    return out


def _sample_each(model, prompts: Sequence[str], *, threads: int, seed: int,
                 max_new_tokens: int, temperature: float) -> List[Optional[str]]:
    """The target's sampled continuation of each raw prompt (the chat template already
    applied), ``threads`` at a time, each with its own seed; None where it ran out of tokens."""
    from .generate import generate

    tok = model.require_tokenizer()
    stop = sorted(set(tok.eog_ids) | set(tok.encode("<|im_end|>")))
    out: List[Optional[str]] = [None] * len(prompts)
    lock = threading.Lock()
    counter = iter(range(len(prompts)))

    def work() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            g = generate(model, prompts[i], max_new_tokens=max_new_tokens,
                         temperature=temperature, top_p=0.95, seed=seed * 1000003 + i,
                         stop_tokens=stop)
            if g.finish_reason != "length":
                out[i] = (g.text or "").replace("<|im_end|>", "").strip()

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def self_user_turns(model, n: int, seed: int = 0, threads: int = 8,
                    max_new_tokens: int = 60) -> List[str]:
    """User turns the target writes itself: its chat template opened on a user turn, sampled
    at temperature 1 until the turn ends. Short, blank or cut-off turns are dropped, so fewer
    than ``n`` may come back."""
    tok = model.require_tokenizer()
    head = tok.apply_chat_template([{"role": "user", "content": "x"}],
                                   add_generation_prompt=False)
    head = head[:head.rindex("x")]  # the template up to where the user's words begin
    got = _sample_each(model, [head] * n, threads=threads, seed=seed,
                       max_new_tokens=max_new_tokens, temperature=1.0)
    return sorted({t for t in got if t is not None and 15 <= len(t) <= 400})


# Translation into English, as users ask it ("Translate German to English: <sentence>"). The
# sources are sentences the target wrote, translated by the target into another language: a
# small model's German is rough, but the answers teach the head what the target does with a
# sentence in another language, which no English-only prompt shows it.
TO_ENGLISH_TASKS = [
    "Translate {lang} to English: {s}",
    "Translate this {lang} sentence into English: {s}",
    "Translate into English:\n\n{s}",
    "What does this mean in English? {s}",
]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def english_sentences(passages: Sequence[str], min_chars: int = 40,
                      max_chars: int = 220) -> List[str]:
    """Distinct one-line sentences of ``passages`` (split after ``.``, ``!`` or ``?``) that
    start with a capital letter and hold ``min_chars`` to ``max_chars`` characters, sorted."""
    out = set()
    for p in passages:
        for line in p.splitlines():
            for s in _SENTENCE_END.split(line.strip()):
                s = s.strip()
                if min_chars <= len(s) <= max_chars and s[0].isupper() and s[-1] in ".!?":
                    out.add(s)
    return sorted(out)


def usable_translation(source: str, text: Optional[str]) -> Optional[str]:
    """The first line of the target's translation of ``source``, or None where it is not a
    translation worth asking about: empty, too short or long, mostly the source's own words
    (left in English), or repetitive (a loop of a few words)."""
    lines = (text or "").strip().splitlines()
    if not lines:
        return None
    line = lines[0].strip().strip('"').strip()
    words = line.lower().split()
    if not 20 <= len(line) <= 2 * len(source) + 40 or len(words) < 4:
        return None
    src = set(source.lower().split())
    if sum(w in src for w in words) > 0.5 * len(words) or len(set(words)) < 0.6 * len(words):
        return None
    return line


def to_english_prompts(model, sentences: Sequence[str], n: int, seed: int = 0,
                       threads: int = 8) -> List[str]:
    """Up to ``n`` requests to translate into English: ``n`` of ``sentences``, drawn at
    random, each translated by the target (sampled at temperature 0.7) into a language of
    ``LANGUAGES`` (German half of the time), kept where ``usable_translation`` keeps it, and
    put in a task of ``TO_ENGLISH_TASKS``."""
    if not sentences:
        return []
    rng = random.Random(seed)
    tok = model.require_tokenizer()
    picks = [(rng.choice(sentences),
              "German" if rng.random() < 0.5 else rng.choice(LANGUAGES)) for _ in range(n)]
    asks = [tok.apply_chat_template(
        [{"role": "user", "content": f"Translate the following sentence into {lang}:\n\n{s}"}],
        add_generation_prompt=True) for s, lang in picks]
    got = _sample_each(model, asks, threads=threads, seed=seed, max_new_tokens=96,
                       temperature=0.7)
    out = []
    for (s, lang), text in zip(picks, got):
        line = usable_translation(s, text)
        if line is not None:
            out.append(rng.choice(TO_ENGLISH_TASKS).format(lang=lang, s=line))
    return list(dict.fromkeys(out))


# ---------------------------------------------------------------------------------------------
# Sampling settings: each prompt is answered once, greedily or sampled, by a fixed rule of its
# index so that a resumed run makes the same choices.

@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float


SAMPLINGS = (Sampling(0.0, 1.0), Sampling(0.7, 0.95), Sampling(1.0, 0.95))


def eagle3_layers(n_layers: int) -> List[int]:
    """The target layers whose inputs EAGLE-3 taps: 2, L // 2 and L - 3 (low, middle, high)."""
    return [2, n_layers // 2, n_layers - 3]


# ---------------------------------------------------------------------------------------------
# Shards

SHARD_FILES = ("tokens.npy", "starts.npy", "answer.npy", "feats.npy", "topk_ids.npy",
               "topk_logits.npy", "meta.json")


def shard_name(i: int) -> str:
    return f"shard_{i:05d}"


def list_shards(data_dir: str) -> List[str]:
    """The complete shards under ``data_dir``, in order."""
    if not os.path.isdir(data_dir):
        return []
    names = sorted(n for n in os.listdir(data_dir)
                   if n.startswith("shard_") and not n.endswith(".tmp"))
    return [os.path.join(data_dir, n) for n in names
            if all(os.path.exists(os.path.join(data_dir, n, f)) for f in SHARD_FILES)]


def split_shards(shards: Sequence[str], held_out: int) -> Tuple[List[str], List[str]]:
    """(training shards, held-out shards): ``held_out`` shards spread evenly over the list, so
    that they mix the prompt kinds (the passage tasks come last); none when there are too few."""
    n = len(shards)
    if held_out <= 0 or n <= held_out:
        return list(shards), []
    pick = {min(n - 1, int((j + 0.5) * n / held_out)) for j in range(held_out)}
    return ([p for i, p in enumerate(shards) if i not in pick],
            [p for i, p in enumerate(shards) if i in pick])


def kept_split(work: str, shards: Sequence[str],
               held_out: int) -> Tuple[List[str], List[str]]:
    """``split_shards``, with the held-out shards kept in ``WORK/held_out.json`` by the first
    call: data added to a run later (more shards) goes to training, and the shards held out
    stay so, so an extended run never trains on what its evaluation reads. A different
    ``held_out`` than the kept one, or a kept shard gone, chooses again."""
    path = os.path.join(work, "held_out.json")
    names = [os.path.basename(p) for p in shards]
    if os.path.exists(path):
        with open(path) as f:
            kept = json.load(f)
        if kept["held_out"] == held_out and set(kept["shards"]) <= set(names):
            held = set(kept["shards"])
            return ([p for p, n in zip(shards, names) if n not in held],
                    [p for p, n in zip(shards, names) if n in held])
    train, held_sh = split_shards(shards, held_out)
    with open(path + ".tmp", "w") as f:
        json.dump({"held_out": held_out, "shards": [os.path.basename(p) for p in held_sh]}, f)
    os.replace(path + ".tmp", path)
    return train, held_sh


def topk_rows(logits: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest logits of each row and their ids, best first: (ids int32, logits)."""
    idx = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    vals = np.take_along_axis(logits, idx, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    return (np.take_along_axis(idx, order, axis=1).astype(np.int32),
            np.take_along_axis(vals, order, axis=1))


def write_shard(path: str, seqs: Sequence[Tuple[List[int], int]], feats: Sequence[np.ndarray],
                topk: Sequence[Tuple[np.ndarray, np.ndarray]], meta: Mapping) -> None:
    """Write one shard atomically (a temporary directory renamed into place).

    ``seqs``: (tokens, answer start) per sequence; ``feats``: (T, 3H) per sequence; ``topk``:
    (ids (T, K), logits (T, K)) per sequence."""
    tmp = path + ".tmp"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    lens = [len(t) for t, _ in seqs]
    starts = np.zeros(len(seqs) + 1, np.int64)
    starts[1:] = np.cumsum(lens)
    np.save(os.path.join(tmp, "tokens.npy"),
            np.concatenate([np.asarray(t, np.int32) for t, _ in seqs]))
    np.save(os.path.join(tmp, "starts.npy"), starts)
    np.save(os.path.join(tmp, "answer.npy"), np.asarray([a for _, a in seqs], np.int64))
    np.save(os.path.join(tmp, "feats.npy"), np.concatenate(feats).astype(np.float16))
    np.save(os.path.join(tmp, "topk_ids.npy"), np.concatenate([i for i, _ in topk]))
    np.save(os.path.join(tmp, "topk_logits.npy"),
            np.concatenate([v for _, v in topk]).astype(np.float16))
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    if os.path.exists(path):
        shutil.rmtree(path)
    os.rename(tmp, path)


@dataclass
class Shard:
    """A shard's arrays, memory-mapped."""

    tokens: np.ndarray
    starts: np.ndarray
    answer: np.ndarray
    feats: np.ndarray
    topk_ids: np.ndarray
    topk_logits: np.ndarray

    @property
    def n_seqs(self) -> int:
        return len(self.answer)

    def seq(self, s: int) -> Dict[str, np.ndarray]:
        a, b = int(self.starts[s]), int(self.starts[s + 1])
        return {"tokens": self.tokens[a:b], "answer": int(self.answer[s]),
                "feats": self.feats[a:b], "topk_ids": self.topk_ids[a:b],
                "topk_logits": self.topk_logits[a:b]}


def read_shard(path: str) -> Shard:
    def ld(name: str) -> np.ndarray:
        return np.load(os.path.join(path, name), mmap_mode="r")

    return Shard(ld("tokens.npy"), ld("starts.npy"), ld("answer.npy"), ld("feats.npy"),
                 ld("topk_ids.npy"), ld("topk_logits.npy"))


def sequence_features(model, tokens: Sequence[int], layers: Sequence[int],
                      k: int, answer: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One forward of the target over ``tokens``: the residual stream entering ``layers``
    concatenated per token, (T, len(layers) * H) float16, and the top-``k`` next-token logits
    of the rows from ``answer - 1`` on (the rows that predict answer tokens; the prompt's
    other rows get ids -1 and logits 0)."""
    T = len(tokens)
    cache = model.new_cache(T)
    n_rows = T - (answer - 1)
    logits, _, aux = model.forward(cache, tokens, n_logits=n_rows, aux_layers=list(layers))
    feats = np.ascontiguousarray(aux.transpose(1, 0, 2)).reshape(T, -1).astype(np.float16)
    ids = np.full((T, k), -1, np.int32)
    vals = np.zeros((T, k), np.float32)
    i, v = topk_rows(logits, k)
    ids[answer - 1:] = i
    vals[answer - 1:] = v
    return feats, ids, vals


def generate_shard(model, prompts: Sequence[Tuple[int, str]], path: str, *, layers: Sequence[int],
                   k: int, max_new_tokens: int, threads: int, seed: int,
                   speculator_factory=None) -> Dict:
    """Answer ``prompts`` ((global index, text) pairs) with the target, several at once on
    threads (batched by specdec's scheduler), take each sequence's features and top-k logits,
    and write the shard at ``path``. Returns the shard's meta."""
    from .generate import generate

    t0 = time.time()
    results: Dict[int, Tuple[List[int], int, Dict]] = {}
    lock = threading.Lock()
    queue = list(prompts)

    def work() -> None:
        while True:
            with lock:
                if not queue:
                    return
                gi, text = queue.pop(0)
            smp = SAMPLINGS[gi % len(SAMPLINGS)]
            spec = speculator_factory() if speculator_factory is not None else None
            g = generate(model, [{"role": "user", "content": text}],
                         max_new_tokens=max_new_tokens, temperature=smp.temperature,
                         top_p=smp.top_p, seed=seed * 1000003 + gi, speculator=spec)
            if len(g.tokens) < 4:
                continue
            toks = list(g.prompt_tokens) + list(g.tokens)
            info = {"index": gi, "prompt": text, "temperature": smp.temperature,
                    "top_p": smp.top_p, "finish": g.finish_reason, "new_tokens": len(g.tokens)}
            with lock:
                results[gi] = (toks, len(g.prompt_tokens), info)

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    t1 = time.time()
    order = sorted(results)
    seqs, feats, topk, infos = [], [], [], []
    for gi in order:
        toks, answer, info = results[gi]
        f, i, v = sequence_features(model, toks, layers, k, answer)
        seqs.append((toks, answer))
        feats.append(f)
        topk.append((i, v))
        infos.append(info)
    t2 = time.time()
    meta = {"layers": list(layers), "k": k, "max_new_tokens": max_new_tokens,
            "sequences": infos, "generate_s": round(t1 - t0, 2),
            "features_s": round(t2 - t1, 2),
            "tokens": int(sum(len(s) for s, _ in seqs)),
            "answer_tokens": int(sum(len(s) - a for s, a in seqs))}
    if seqs:
        write_shard(path, seqs, feats, topk, meta)
    return meta


def embedding_table(model, chunk: int = 512) -> np.ndarray:
    """The target's token embedding, as its forward computes it (the residual stream entering
    layer 0), for every id: float32 (V, H). Costs a forward over the whole vocabulary."""
    V, H = model.config.vocab_size, model.config.hidden_size
    out = np.empty((V, H), np.float32)
    for a in range(0, V, chunk):
        ids = list(range(a, min(V, a + chunk)))
        cache = model.new_cache(len(ids))
        _, _, aux = model.forward(cache, ids, n_logits=1, aux_layers=[0])
        out[a:a + len(ids)] = aux[0]
    return out


# ---------------------------------------------------------------------------------------------
# Draft vocabulary (EAGLE-3: the Vd most frequent target tokens of the training answers; draft
# id i is the i-th of them in ascending target id, target id = i + d2t[i]).

def token_counts(shards: Iterable[Shard], vocab_size: int) -> np.ndarray:
    """How often each target id occurs in the answers of ``shards``."""
    counts = np.zeros(vocab_size, np.int64)
    for sh in shards:
        for s in range(sh.n_seqs):
            a, b = int(sh.starts[s]) + int(sh.answer[s]), int(sh.starts[s + 1])
            counts += np.bincount(np.asarray(sh.tokens[a:b]), minlength=vocab_size)
    return counts


def draft_vocab(counts: np.ndarray, vd: int,
                always: Sequence[int] = ()) -> Tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The ``vd`` most frequent ids (ties: the lower id), with ``always`` (e.g. the
    end-of-generation ids) forced in. Returns (draft-to-target ids ascending, d2t int64 (vd,),
    t2d bool (V,), coverage: the fraction of counted tokens inside the draft vocabulary)."""
    V = len(counts)
    if not 0 < vd <= V:
        raise ValueError(f"draft vocabulary size must be in 1..{V}, got {vd}")
    order = np.lexsort((np.arange(V), -counts))  # by count descending, then id
    forced = [int(i) for i in always if 0 <= int(i) < V]
    chosen = list(dict.fromkeys(forced))
    chosen_set = set(chosen)
    for i in order:
        if len(chosen) >= vd:
            break
        if int(i) not in chosen_set:
            chosen.append(int(i))
            chosen_set.add(int(i))
    ids = np.array(sorted(chosen[:vd]), np.int64)
    d2t = ids - np.arange(len(ids), dtype=np.int64)
    t2d = np.zeros(V, bool)
    t2d[ids] = True
    total = counts.sum()
    coverage = float(counts[ids].sum() / total) if total else 0.0
    return ids, d2t, t2d, coverage


# ---------------------------------------------------------------------------------------------
# Export: the published EAGLE-3 layout (config.json + model.safetensors).

_ST_DTYPES = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32",
              np.dtype(np.int64): "I64", np.dtype(np.bool_): "BOOL",
              np.dtype(np.int32): "I32"}


def write_safetensors(path: str, tensors: Mapping[str, np.ndarray],
                      metadata: Optional[Mapping[str, str]] = None) -> None:
    """Write ``tensors`` as a safetensors file: an 8-byte little-endian header length, a JSON
    header (per name: dtype, shape, [begin, end) byte offsets into the data; keys sorted, padded
    with spaces to a multiple of 8), then the little-endian row-major data."""
    header: Dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    blobs = []
    off = 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        if a.dtype not in _ST_DTYPES:
            raise ValueError(f"tensor {name!r}: unsupported dtype {a.dtype}")
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        b = a.tobytes()
        header[name] = {"dtype": _ST_DTYPES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path: str) -> Dict[str, np.ndarray]:
    """Read a safetensors file written by :func:`write_safetensors` (or any with these
    dtypes) into NumPy arrays."""
    rev = {v: k for k, v in _ST_DTYPES.items()}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[a:b], rev[info["dtype"]]).reshape(info["shape"])
    return out


def eagle3_config(target_config, intermediate_size: int, draft_vocab_size: int) -> Dict:
    """config.json of an EAGLE-3 head for ``target_config`` (a :class:`specdec.ModelConfig`)."""
    c = target_config
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": int(intermediate_size),
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "rms_norm_eps": float(f"{c.rms_eps:.6g}"),  # the file's f32 1e-5 read back as 1e-05
        "rope_theta": float(c.rope_theta),
        "max_position_embeddings": c.context_length,
        "vocab_size": c.vocab_size,
        "draft_vocab_size": int(draft_vocab_size),
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bias": False,
        "torch_dtype": "float16",
    }


def eagle3_shapes(H: int, n_heads: int, n_kv: int, head_dim: int, F: int, V: int,
                  Vd: int) -> Dict[str, Tuple[int, ...]]:
    """The published EAGLE-3 head's tensors and shapes (no embedding: the target's is used)."""
    return {
        "fc.weight": (H, 3 * H),
        "midlayer.input_layernorm.weight": (H,),
        "midlayer.hidden_norm.weight": (H,),
        "midlayer.self_attn.q_proj.weight": (n_heads * head_dim, 2 * H),
        "midlayer.self_attn.k_proj.weight": (n_kv * head_dim, 2 * H),
        "midlayer.self_attn.v_proj.weight": (n_kv * head_dim, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, n_heads * head_dim),
        "midlayer.post_attention_layernorm.weight": (H,),
        "midlayer.mlp.gate_proj.weight": (F, H),
        "midlayer.mlp.up_proj.weight": (F, H),
        "midlayer.mlp.down_proj.weight": (H, F),
        "norm.weight": (H,),
        "lm_head.weight": (Vd, H),
        "d2t": (Vd,),
        "t2d": (V,),
    }


def export_eagle3(out_dir: str, weights: Mapping[str, np.ndarray], config: Mapping,
                  dtype=np.float16) -> None:
    """Write ``config.json`` and ``model.safetensors`` of an EAGLE-3 head into ``out_dir``
    after checking every tensor's name and shape against the published layout: float weights
    as ``dtype``, ``d2t`` int64, ``t2d`` bool."""
    c = config
    shapes = eagle3_shapes(c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
                           c["head_dim"], c["intermediate_size"], c["vocab_size"],
                           c["draft_vocab_size"])
    missing = sorted(set(shapes) - set(weights))
    extra = sorted(set(weights) - set(shapes))
    if missing or extra:
        raise ValueError(f"EAGLE-3 export: missing tensors {missing}, unexpected {extra}")
    tensors = {}
    for name, shape in shapes.items():
        a = np.asarray(weights[name])
        if tuple(a.shape) != shape:
            raise ValueError(f"EAGLE-3 export: {name} has shape {tuple(a.shape)}, expected "
                             f"{shape}")
        if name == "d2t":
            a = a.astype(np.int64)
        elif name == "t2d":
            a = a.astype(bool)
        else:
            a = a.astype(dtype)
        tensors[name] = a
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
    with open(os.path.join(out_dir, "config.json.tmp"), "w") as f:
        json.dump(dict(config), f, indent=2)
    os.replace(os.path.join(out_dir, "config.json.tmp"), os.path.join(out_dir, "config.json"))
