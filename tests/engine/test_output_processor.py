"""OutputProcessor: the plain rows' short path gives the outputs of the general path."""

import random

import pytest

from pagedjax.engine.core_output import CoreOutput, SeqUpdate
from pagedjax.engine.output_processor import OutputProcessor
from pagedjax.sampling_params import RequestOutputKind, SamplingParams

from tests.engine.test_tokenizer import TEXTS


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer):
    return smollm2_tokenizer


PARAMS = {
    "plain": SamplingParams(max_tokens=64),
    "stop": SamplingParams(max_tokens=64, stop=["ing", "!"]),
    "raw": SamplingParams(max_tokens=64, detokenize=False),
    "delta": SamplingParams(max_tokens=64, output_kind=RequestOutputKind.DELTA),
    "final": SamplingParams(max_tokens=64, output_kind=RequestOutputKind.FINAL_ONLY),
}


def _run(tok, columns: bool):
    """Feed each request one token per step (the last with finish 'length'), as the
    core's plain columns or as SeqUpdates; every output and stop, step by step."""
    proc = OutputProcessor(tok)
    prompt = tok.encode("Tell me:", add_special_tokens=False)
    streams = {}
    rng = random.Random(0)
    for name, p in PARAMS.items():
        proc.add_request(name, None, prompt, p, 0.0)
        text = rng.choice(TEXTS)
        streams[name] = tok.encode(text, add_special_tokens=False)[:12]
    log = []
    stopped = set()
    for step in range(12):
        core = CoreOutput()
        for name, ids in streams.items():
            if name in stopped or step >= len(ids):
                continue
            last = step == len(ids) - 1
            if columns and not last:
                core.token_request_ids.append(name)
                core.token_ids.append(ids[step])
            else:
                core.updates.append(SeqUpdate(name, name, 0, [ids[step]],
                                              finish_reason="length" if last else None))
        outputs, stops = proc.process(core)
        stopped.update(sid for sid, _ in stops)  # the core would finish them
        log.append(([(o.request_id, [(c.text, list(c.token_ids), c.finish_reason)
                                     for c in o.outputs], o.finished) for o in outputs],
                    stops))
    return log, proc.num_generated_tokens


def test_plain_columns_match_seq_updates(tok):
    by_columns, n_columns = _run(tok, columns=True)
    by_updates, n_updates = _run(tok, columns=False)
    # The same outputs and stops, step by step (within a step, the plain rows come first).
    for (a, sa), (b, sb) in zip(by_columns, by_updates):
        assert sorted(a) == sorted(b) and sa == sb
    assert n_columns == n_updates
    final = {rid: outs for step, _ in by_updates for rid, outs, done in step if done}
    assert set(final) == set(PARAMS)  # each finished once: by 'length' or a stop string
    assert final["raw"][0][0] == ""  # detokenize=False: token ids only
    assert final["plain"][0][1] and final["plain"][0][2] == "length"
