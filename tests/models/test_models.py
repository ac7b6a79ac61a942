"""Each architecture against transformers' PyTorch model on a tiny random config.

Tolerance (fp32 everywhere): |ours - torch| <= 2e-4 * max(1, max|torch logits|)
elementwise on logits. Weights are re-randomized with std ~0.15 (instead of
HF's 0.02 init) so logits span several units and errors show.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pagedjax.kernels_pallas as kernels_pallas  # noqa: E402
import pagedjax.models as models  # noqa: E402
from pagedjax.models.base import ExecutionPlan  # noqa: E402
from pagedjax.models.metadata import SeqChunk, build_metadata  # noqa: E402

RTOL_SCALE = 2e-4
VOCAB = 96


def _tiny_configs():
    T = transformers
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return {
        "llama": lambda: T.LlamaConfig(
            **common, tie_word_embeddings=False,
            rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 16}),
        "mistral": lambda: T.MistralConfig(**common, sliding_window=5, tie_word_embeddings=True),
        "qwen2": lambda: T.Qwen2Config(**common, tie_word_embeddings=False),
        "qwen3": lambda: T.Qwen3Config(**common, head_dim=16, tie_word_embeddings=False),
        "phi3": lambda: T.Phi3Config(
            **{**common, "max_position_embeddings": 64}, tie_word_embeddings=False,
            original_max_position_embeddings=16, pad_token_id=0,
            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                             "original_max_position_embeddings": 16,
                             "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 4.0],
                             "long_factor": [1.0, 1.5, 2.2, 3.0, 4.1, 5.5, 7.0, 9.0]}),
        "gpt2": lambda: T.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4,
                                     n_positions=64),
        "opt": lambda: T.OPTConfig(vocab_size=VOCAB, hidden_size=64, ffn_dim=96,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   max_position_embeddings=64, word_embed_proj_dim=32),
        "opt_postnorm": lambda: T.OPTConfig(vocab_size=VOCAB, hidden_size=64, ffn_dim=96,
                                            num_hidden_layers=2, num_attention_heads=4,
                                            max_position_embeddings=64, word_embed_proj_dim=64,
                                            do_layer_norm_before=False),
        "gemma3": lambda: T.Gemma3TextConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=64, sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            # transformers 5.24 ignores attn_logit_softcapping for Gemma 3 (released
            # Gemma 3 configs leave it None), so it stays off here; we honour it if set.
            query_pre_attn_scalar=24, attn_logit_softcapping=None, final_logit_softcapping=15.0,
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                "rope_theta": 1000000.0}}),
    }


ARCHS = list(_tiny_configs())


def _randomize(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name or name.endswith(("ln_1.weight", "ln_2.weight",
                                                                 "ln_f.weight")):
                base = 0.0 if "gemma" in type(model).__name__.lower() else 1.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))


@pytest.fixture(scope="module")
def tiny(request, tmp_path_factory):
    """arch -> (hf torch model, folder, our model, params); built lazily and cached."""
    cache = {}

    def get(arch):
        if arch not in cache:
            cfg = _tiny_configs()[arch]()
            cfg._attn_implementation = "eager"
            torch.manual_seed(0)
            hf = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
            _randomize(hf, seed=len(arch))
            hf.eval()
            folder = tmp_path_factory.mktemp(arch)
            hf.save_pretrained(folder)
            model, params = models.load_model(str(folder), dtype="float32")
            # One jitted forward per model, so tests share compiled shapes.
            model.jit_forward = jax.jit(model.forward, donate_argnums=1)
            model.jit_logits = jax.jit(model.compute_logits)
            cache[arch] = (hf, str(folder), model, params)
        return cache[arch]

    return get


def hf_logits(hf, ids) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor([list(ids)])).logits[0].float().numpy()


def assert_close(ours, ref, what=""):
    ours, ref = np.asarray(ours), np.asarray(ref)
    tol = RTOL_SCALE * max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(ours - ref).max())
    assert np.isfinite(ours).all(), f"{what}: non-finite logits"
    assert err <= tol, f"{what}: max |diff| {err:.3g} > tol {tol:.3g}"


PREFILL_PAD = dict(pad_tokens_to=16, pad_seqs_to=4, max_q_len=16)  # one compiled shape
DECODE_PAD = dict(pad_tokens_to=4, pad_seqs_to=4, max_q_len=1)  # and one for decode


class PagedRunner:
    """Drives model.forward through a NaN-filled page pool with shuffled pages.

    Every step is padded to PREFILL_PAD or DECODE_PAD (padding tokens write to the
    null page, padding sequences have no rows)."""

    def __init__(self, model, params, num_pages=48, page_size=4, seed=0):
        self.model, self.params, self.page_size = model, params, page_size
        caches = model.allocate_kv_caches(num_pages, page_size)
        self.caches = jax.tree_util.tree_map(lambda a: jnp.full_like(a, jnp.nan), caches)
        self.free = [int(p) for p in np.random.default_rng(seed).permutation(np.arange(1, num_pages))]
        self.seqs: dict[str, tuple[list[int], int]] = {}
        self.fwd = getattr(model, "jit_forward", None) or jax.jit(model.forward, donate_argnums=1)
        self.logits = getattr(model, "jit_logits", None) or jax.jit(model.compute_logits)

    def step(self, batch):
        """batch: [(seq_id, new token ids)] -> {seq_id: logits [n, V]}."""
        chunks, tokens = [], []
        for sid, toks in batch:
            pages, done = self.seqs.get(sid, ([], 0))
            while len(pages) * self.page_size < done + len(toks):
                pages.append(self.free.pop())
            self.seqs[sid] = (pages, done + len(toks))
            chunks.append(SeqChunk(list(pages), done, len(toks)))
            tokens += list(toks)
        pad = DECODE_PAD if all(c.num_new == 1 for c in chunks) else PREFILL_PAD
        meta = build_metadata(chunks, self.page_size, pages_per_seq=8, **pad)
        ids = np.zeros(meta.positions.shape[0], np.int32)
        ids[: len(tokens)] = tokens
        hidden, self.caches = self.fwd(self.params, self.caches, jnp.asarray(ids), meta)
        logits = np.asarray(self.logits(self.params, hidden))
        out, start = {}, 0
        for sid, toks in batch:
            out[sid] = logits[start: start + len(toks)]
            start += len(toks)
        return out


def _prompt(seed, n):
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, n)]


@pytest.mark.parametrize("arch", ARCHS)
def test_full_sequence_logits(tiny, arch):
    hf, _, model, params = tiny(arch)
    ids = _prompt(1, 13)
    runner = PagedRunner(model, params)
    ours = runner.step([("a", ids)])["a"]
    assert_close(ours, hf_logits(hf, ids), f"{arch} full sequence")


@pytest.mark.parametrize("arch", ARCHS)
def test_chunked_prefill_then_decode(tiny, arch):
    """Two prefill chunks (5, 6 tokens) then 5 decode steps, page_size 4, NaN pool."""
    hf, _, model, params = tiny(arch)
    ids = _prompt(2, 16)
    ref = hf_logits(hf, ids)
    runner = PagedRunner(model, params, seed=3)
    got = [runner.step([("s", ids[:5])])["s"], runner.step([("s", ids[5:11])])["s"]]
    for i in range(11, 16):
        got.append(runner.step([("s", ids[i:i + 1])])["s"])
    assert_close(np.concatenate(got), ref, f"{arch} chunked")


@pytest.mark.parametrize("arch", ARCHS)
def test_mixed_batch(tiny, arch):
    """One call mixing a new prefill, a decode row and a second chunk (+ padding),
    then one call of three decode rows."""
    hf, _, model, params = tiny(arch)
    a, b, c = _prompt(4, 8), _prompt(5, 8), _prompt(6, 10)
    runner = PagedRunner(model, params, seed=5)
    s1 = runner.step([("b", b[:6]), ("c", c[:3])])
    s2 = runner.step([("a", a[:7]), ("b", b[6:7]), ("c", c[3:9])])
    s3 = runner.step([("c", c[9:]), ("a", a[7:]), ("b", b[7:])])
    assert_close(np.concatenate([s2["a"], s3["a"]]), hf_logits(hf, a), f"{arch} batch seq a")
    assert_close(np.concatenate([s1["b"], s2["b"], s3["b"]]), hf_logits(hf, b),
                 f"{arch} batch seq b")
    assert_close(np.concatenate([s1["c"], s2["c"], s3["c"]]), hf_logits(hf, c),
                 f"{arch} batch seq c")


def test_int8_kv_cache_close(tiny):
    """int8 KV pool: logits within 5e-2 * scale of the fp32 reference (quantization error)."""
    hf, _, model, params = tiny("llama")
    ids = _prompt(7, 10)
    caches = model.allocate_kv_caches(16, 4, "int8")
    meta = build_metadata([SeqChunk([3, 1, 7], 0, len(ids))], 4)
    hidden, caches = jax.jit(model.forward)(params, caches, jnp.asarray(ids, jnp.int32), meta)
    ours = np.asarray(model.compute_logits(params, hidden))
    ref = hf_logits(hf, ids)
    assert np.abs(ours - ref).max() <= 5e-2 * max(1.0, np.abs(ref).max())


def test_attention_fn_hook_gets_every_layer(tiny):
    """plan.attention_fn replaces the kernel call (benchmarks, tests); same logits."""
    hf, _, model, params = tiny("gemma3")
    calls = []

    def spy(q, *args, **kw):
        calls.append(kw["sliding_window"])
        return kernels_pallas.ragged_paged_attention(q, *args, **kw)

    ids = _prompt(8, 6)
    plan = ExecutionPlan(attention_fn=spy)
    meta = build_metadata([SeqChunk([2, 1], 0, len(ids))], 4)
    hidden, _ = jax.jit(model.forward, static_argnums=4)(
        params, model.allocate_kv_caches(4, 4), jnp.asarray(ids, jnp.int32), meta, plan)
    assert calls == [4, None, 4]  # sliding, full, sliding
    assert_close(model.compute_logits(params, hidden), hf_logits(hf, ids), "gemma3 hook")


def test_param_paths_are_readable(tiny):
    _, _, model, params = tiny("qwen2")
    attn = params["layers"][1]["attn"]
    assert attn["qkv_proj"]["kernel"].shape == (64, 2, 4, 16)  # [H, Hkv, G+2, D]
    assert attn["qkv_proj"]["bias"].shape == (2, 4, 16)
    assert attn["o_proj"]["kernel"].shape == (64, 64)
    assert params["layers"][0]["mlp"]["gate_up"]["kernel"].shape == (64, 2, 96)
    assert model.info.num_kv_heads == 2 and model.info.head_dim == 16


# ----------------------------------------------------------------------------- errors


def test_unknown_architecture(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["BertForMaskedLM"]}')
    with pytest.raises(ValueError, match="BertForMaskedLM.*supported: .*LlamaForCausalLM"):
        models.load_model(str(tmp_path))


def test_missing_folder_and_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder, a .gguf file or a hub id"):
        models.resolve_model(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="config.json"):
        models.resolve_model(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        models.resolve_model(str(tmp_path / "x.gguf"))
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    with pytest.raises(ValueError, match="hidden_size"):
        models.load_model(str(tmp_path))


def test_unsupported_config_field(tiny, tmp_path):
    _, folder, _, _ = tiny("llama")
    cfg = models.resolve_model(folder).hf_config
    with pytest.raises(ValueError, match="rope_scaling.*yarn"):
        models.model_class("LlamaForCausalLM")(
            {**cfg, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}})
    with pytest.raises(ValueError, match="hidden_act"):
        models.model_class("LlamaForCausalLM")({**cfg, "hidden_act": "mish"})


def test_bad_dtype():
    with pytest.raises(ValueError, match="dtype"):
        models.resolve_dtype("int4")


def test_phi3_longrope_long_prompt(tiny):
    """A 24-token prompt (> original_max_position_embeddings=16) switches Phi-3 to the
    long factors, as transformers does for the whole forward; the short test prompts
    above stay on the short ones."""
    hf, _, model, params = tiny("phi3")
    assert hf.config.rope_parameters["rope_type"] == "longrope"
    ids = _prompt(9, 24)
    meta = build_metadata([SeqChunk(list(range(1, 8)), 0, len(ids))], 4)
    caches = model.allocate_kv_caches(8, 4)
    hidden, _ = jax.jit(model.forward)(params, caches, jnp.asarray(ids, jnp.int32), meta)
    ref = hf_logits(hf, ids)
    assert_close(model.compute_logits(params, hidden), ref, "phi3 long prompt")
    short = PagedRunner(model, params).step([("a", ids[:16])])["a"]
    assert_close(short, hf_logits(hf, ids[:16]), "phi3 short prompt")
    assert np.abs(short - ref[:16]).max() > 1e-3  # the factors differ, so must the logits
