"""Workloads for ``pagedjax bench serve``: random and ShareGPT-shaped requests.

A request is ``(prompt text, expected output tokens)``. The server counts the
tokens (``usage`` in its stream), so the benchmark needs no tokenizer and runs
against any OpenAI-compatible server.

* ``random``: prompts of about ``input_len`` tokens drawn from a word list (one
  common English word is about one token in BPE vocabularies), lengths spread
  over ``[len * (1 - range_ratio), len * (1 + range_ratio)]``;
* ``sharegpt``: the first human turn of each conversation of a ShareGPT JSON
  file (``[{"conversations": [{"from": "human", "value": ..}, {"from": "gpt",
  "value": ..}]}]``), the reply's length (4/3 tokens a word) as output length;
* ``sharegpt-lengths``: no file, ShareGPT's length shape: lognormal lengths
  (sigma 0.8) around the vLLM paper's ShareGPT means (161 input / 338 output
  tokens) times ``scale``, word prompts as in ``random``, input and output
  together within ``max_len``.
"""

from __future__ import annotations

import json
import random
import math
from dataclasses import dataclass

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from "
         "at which but have an they you were her she there been one all we their has would "
         "when if so no what more up out about who some them into time can only could new "
         "other then these two may first any like now my such over our even most after also "
         "made many before must well back through years much where your way down should "
         "because each just those people how too little state good very make world still see "
         "own men work long here get both between life being under never day same another "
         "know while last might great old year off come since go against came right used "
         "take three small place house water room city music story light garden river").split()


SHAREGPT_MEAN_IN, SHAREGPT_MEAN_OUT = 161, 338


@dataclass
class BenchRequest:
    prompt: str
    output_len: int
    prompt_words: int


def random_requests(n: int, input_len: int, output_len: int, range_ratio: float,
                    seed: int) -> list[BenchRequest]:
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    if input_len < 1 or output_len < 1:
        raise ValueError("--random-input-len and --random-output-len must be >= 1")
    rng = random.Random(seed)

    def draw(x: int) -> int:
        return max(1, rng.randint(int(x * (1 - range_ratio)), int(x * (1 + range_ratio))))

    out = []
    for _ in range(n):
        k = draw(input_len)
        out.append(BenchRequest(" ".join(rng.choice(WORDS) for _ in range(k)), draw(output_len),
                                k))
    return out


def sharegpt_length_requests(n: int, scale: float, max_len: int, seed: int,
                             sigma: float = 0.8) -> list[BenchRequest]:
    if not scale > 0 or max_len < 2:
        raise ValueError("--sharegpt-lengths-scale must be > 0 and --sharegpt-lengths-max-len "
                         ">= 2")
    rng = random.Random(seed)

    def draw(mean: float) -> int:
        return max(1, round(rng.lognormvariate(math.log(max(mean * scale, 1.0)) - sigma ** 2 / 2,
                                               sigma)))

    out = []
    for _ in range(n):
        k = min(draw(SHAREGPT_MEAN_IN), max_len // 2)
        o = max(1, min(draw(SHAREGPT_MEAN_OUT), max_len - k - 1))
        out.append(BenchRequest(" ".join(rng.choice(WORDS) for _ in range(k)), o, k))
    return out


def sharegpt_requests(path: str, n: int, seed: int, output_len: int | None = None,
                      max_input_words: int = 1024) -> list[BenchRequest]:
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, list):
        raise ValueError(f"{path}: a ShareGPT file is a JSON list of conversations")
    pairs = []
    for conv in data:
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        q, a = turns[0], turns[1]
        if not all(isinstance(t, dict) and isinstance(t.get("value"), str) for t in (q, a)):
            continue
        words = q["value"].split()
        if not words or len(words) > max_input_words:
            continue
        out = output_len or max(1, round(len(a["value"].split()) * 4 / 3))
        pairs.append(BenchRequest(q["value"], out, len(words)))
    if not pairs:
        raise ValueError(f"{path}: no usable conversations (need a human turn and a reply)")
    random.Random(seed).shuffle(pairs)
    return [pairs[i % len(pairs)] for i in range(n)]
