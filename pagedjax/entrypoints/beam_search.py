"""Beam search on the engine with forked beams that share KV pages.

Each live beam is a scheduler request. Every step the engine runs one token for
all beams and returns the top ``2 * beam_width`` logprobs of each; we keep the
best ``beam_width`` continuations. A parent chosen by several continuations is
forked (``Scheduler.fork_request``): children share all of its pages, and the
partly filled last page is copied on the first write (copy-on-write). Beams
not chosen are aborted, which frees their references.

The candidate token replaces the token the engine sampled for that beam: it
is not computed yet (its KV is written next step), so swapping it is safe.
Scores follow vLLM: ``cum_logprob / len ** length_penalty`` over output tokens.
"""

from __future__ import annotations

import itertools
from pagedjax.outputs import BeamSearchOutput, BeamSearchSequence, get_beam_search_score
from pagedjax.sampling_params import BeamSearchParams, SamplingParams


def run_beam_search(engine, prompts: list, params: BeamSearchParams,
                    id_counter=None) -> list[BeamSearchOutput]:
    """Run beam search for each prompt (all prompts' beams share each step)."""
    ids = id_counter or itertools.count()
    bw = params.beam_width
    eos = set(engine.eos_token_ids)
    results = []
    # Per prompt: live beams {scheduler id: (tokens, cum_logprob)}, finished list.
    groups = []
    step_params = SamplingParams(temperature=0.0, max_tokens=params.max_tokens + 1,
                                 logprobs=2 * bw, ignore_eos=True, detokenize=False)
    for prompt in prompts:
        rid = f"beam-{next(ids)}"
        _, prompt_ids = engine.tokenize(prompt)
        engine.add_request(rid, {"prompt_token_ids": prompt_ids}, step_params, beam=True)
        groups.append(dict(root=rid, prompt_ids=prompt_ids, live={rid: ([], 0.0)}, done=[]))
    fork_ids = itertools.count()
    try:
        for step in range(params.max_tokens):
            # Drive the engine until every live beam got one new token.
            want = {sid for g in groups for sid in g["live"]}
            got: dict[str, tuple[dict, int]] = {}
            while want - set(got):
                engine.step()
                for sid in want - set(got):
                    top = engine.take_top_logprobs(sid)
                    if top is not None:
                        got[sid] = top
                    elif engine.is_sequence_finished(sid):
                        got[sid] = {}  # finished by the engine (length limit): no candidates
                if not engine.has_unfinished_requests() and want - set(got):
                    raise RuntimeError("beam search: the engine stopped with beams pending")
            for g in groups:
                if not g["live"]:
                    continue
                cands = []
                for sid, (toks, cum) in g["live"].items():
                    lp_dict = got[sid]
                    for tok, lp in lp_dict.items():
                        cands.append((cum + lp, sid, tok))
                cands.sort(key=lambda c: -c[0])
                chosen = []
                for cum, sid, tok in cands:
                    if len(chosen) >= bw:
                        break
                    toks = g["live"][sid][0] + [tok]
                    if tok in eos and not params.ignore_eos:
                        g["done"].append((toks, cum))
                        continue
                    chosen.append((sid, toks, cum))
                # Assign the chosen continuations to requests: reuse parents, fork extras.
                new_live = {}
                used = set()
                for sid, toks, cum in chosen:
                    if sid not in used:
                        used.add(sid)
                        target = sid
                    else:
                        target = f"{g['root']}-f{next(fork_ids)}"
                        engine.fork_sequence(sid, target)
                    engine.replace_pending_token(target, toks[-1])
                    new_live[target] = (toks, cum)
                for sid in g["live"]:
                    if sid not in used:
                        engine.finish_sequence(sid)
                if step == params.max_tokens - 1 or not new_live:
                    for sid, (toks, cum) in new_live.items():
                        g["done"].append((toks, cum))
                        engine.finish_sequence(sid)
                    new_live = {}
                g["live"] = new_live
            if all(not g["live"] for g in groups):
                break
    finally:
        for g in groups:
            for sid in g["live"]:
                engine.finish_sequence(sid)
    tok = engine.tokenizer
    for g in groups:
        done = sorted(g["done"], key=lambda d: -get_beam_search_score(
            d[0], d[1], tok.eos_token_id, params.length_penalty))[:bw]
        seqs = [BeamSearchSequence(tokens=g["prompt_ids"] + toks, logprobs=[], cum_logprob=cum,
                                   text=tok.decode(toks, skip_special_tokens=True))
                for toks, cum in done]
        results.append(BeamSearchOutput(sequences=seqs))
    return results
