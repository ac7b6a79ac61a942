"""The real default model (SmolLM2-135M-Instruct, Q4_1 GGUF) against transformers
loaded from the same file (torch, fp32).

Tolerance: logits at every prompt position and at every greedy decode step within
2e-4 * max|torch logits| (~6e-3 absolute; observed ~1e-4). Greedy continuations
of 32 tokens identical (checked by teacher forcing for all prompts, and against
``generate(do_sample=False)`` for one).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pagedjax.models as models  # noqa: E402
from pagedjax.models.metadata import SeqChunk, build_metadata  # noqa: E402

pytestmark = pytest.mark.slow

# Token ids from the GGUF's own tokenizer (hard-coded: building it takes ~10 s).
PROMPTS = {
    # "The capital of France is"
    "france": [504, 3575, 282, 4649, 314],
    # 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
    "code": [1604, 3987, 46477, 24, 94, 727, 472, 1620, 14362, 260, 304, 29, 373, 24681,
             46477, 1230, 7996, 198],
    # chat template, user: "Name three colors of the rainbow.", generation prompt
    "chat": [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28,
             7018, 411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 5820, 1296, 4683, 282, 260,
             24594, 30, 2, 198, 1, 520, 9531, 198],
}
NEW_TOKENS = 32
PAGE_SIZE = 16


@pytest.fixture(scope="module")
def ours(smollm2_gguf):
    resolved = models.resolve_model("SmolLM2-135M-Instruct")
    assert os.path.join(resolved.path, resolved.gguf_file) == smollm2_gguf
    model, params = models.load_model(resolved=resolved, dtype="float32")
    return model, params


@pytest.fixture(scope="module")
def hf(smollm2_gguf):
    folder, name = os.path.split(smollm2_gguf)
    m = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                          dtype=torch.float32)
    return m.eval()


@pytest.fixture(scope="module")
def generated(ours):
    """Batched prefill of all prompts, then batched greedy decode through the pool."""
    model, params = ours
    names = list(PROMPTS)
    pages_per_seq = -(-(max(map(len, PROMPTS.values())) + NEW_TOKENS) // PAGE_SIZE)
    perm = np.random.default_rng(0).permutation(np.arange(1, 1 + len(names) * pages_per_seq))
    pages = {n: [int(p) for p in perm[i::len(names)]] for i, n in enumerate(names)}
    caches = model.allocate_kv_caches(1 + len(names) * pages_per_seq, PAGE_SIZE)
    caches = jax.tree_util.tree_map(lambda a: jnp.full_like(a, jnp.nan), caches)
    fwd = jax.jit(model.forward, donate_argnums=1)
    head = jax.jit(model.compute_logits)

    def step(chunks, tokens, pad_tokens_to):
        nonlocal caches
        meta = build_metadata(chunks, PAGE_SIZE, pad_tokens_to=pad_tokens_to, pad_seqs_to=4,
                              pages_per_seq=pages_per_seq)
        ids = np.zeros(pad_tokens_to, np.int32)
        ids[: len(tokens)] = tokens
        hidden, caches = fwd(params, caches, jnp.asarray(ids), meta)
        return np.asarray(head(params, hidden))[: len(tokens)]

    flat = sum(PROMPTS.values(), [])
    logits = step([SeqChunk(pages[n], 0, len(PROMPTS[n])) for n in names], flat, 64)
    ends = np.cumsum([len(PROMPTS[n]) for n in names])
    prompt_logits = dict(zip(names, np.split(logits, ends[:-1])))
    out = {n: [int(np.argmax(prompt_logits[n][-1]))] for n in names}
    step_logits = {n: [prompt_logits[n][-1]] for n in names}
    for _ in range(NEW_TOKENS - 1):
        chunks = [SeqChunk(pages[n], len(PROMPTS[n]) + len(out[n]) - 1, 1) for n in names]
        logits = step(chunks, [out[n][-1] for n in names], 4)
        for n, row in zip(names, logits):
            out[n].append(int(np.argmax(row)))
            step_logits[n].append(row)
    return prompt_logits, out, {n: np.stack(v) for n, v in step_logits.items()}


@pytest.fixture(scope="module")
def hf_teacher_forced(hf, generated):
    """transformers' logits over each prompt followed by our 32 greedy tokens."""
    out = {}
    for name, prompt in PROMPTS.items():
        with torch.no_grad():
            out[name] = hf(torch.tensor([prompt + generated[1][name]])).logits[0].numpy()
    return out


@pytest.mark.parametrize("name", list(PROMPTS))
def test_prompt_logits_match_transformers(hf_teacher_forced, generated, name):
    ref = hf_teacher_forced[name][: len(PROMPTS[name])]
    got = generated[0][name]
    tol = 2e-4 * float(np.abs(ref).max())
    err = float(np.abs(got - ref).max())
    assert err <= tol, f"{name}: max |diff| {err:.3g} > {tol:.3g}"
    assert (got.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.parametrize("name", list(PROMPTS))
def test_greedy_32_tokens_match_transformers(hf_teacher_forced, generated, name):
    """Each of our greedy tokens is transformers' argmax given the same prefix, which is
    what generate(do_sample=False) computes, one forward instead of 32. The decode-step
    logits match too (same tolerance)."""
    n = len(PROMPTS[name])
    ref = hf_teacher_forced[name][n - 1: n - 1 + NEW_TOKENS]
    assert generated[1][name] == ref.argmax(-1).tolist()
    got = generated[2][name]
    tol = 2e-4 * float(np.abs(ref).max())
    assert float(np.abs(got - ref).max()) <= tol


def test_greedy_matches_transformers_generate(hf, generated):
    prompt = PROMPTS["france"]
    with torch.no_grad():
        seq = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS,
                          do_sample=False)[0, len(prompt):].tolist()
    assert generated[1]["france"][: len(seq)] == seq
    if len(seq) < NEW_TOKENS:  # transformers stopped at an end-of-sequence token
        eos = hf.generation_config.eos_token_id
        assert seq[-1] in (eos if isinstance(eos, list) else [eos])


def test_model_info(ours):
    model, params = ours
    info = model.info
    assert (info.architecture, info.num_layers, info.hidden_size) == ("LlamaForCausalLM", 30, 576)
    assert (info.num_q_heads, info.num_kv_heads, info.head_dim) == (9, 3, 64)
    assert info.vocab_size == 49152 and info.eos_token_ids == (2,) and info.bos_token_id == 1
    assert "lm_head" not in params  # tied embeddings
