"""Qwen3-MoE from a GGUF file: a tiny random transformers model written by the `gguf`
package's writer (llama.cpp's qwen3moe layout: stacked expert tensors, the router as
ffn_gate_inp) loads in pagedjax and gives transformers' logits, prefill and decode."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

import pagedjax.models as models  # noqa: E402
from tests.models.test_models import PagedRunner, _randomize, assert_close, hf_logits  # noqa: E402

VOCAB, LAYERS, EXPERTS = 96, 2, 8


def write_gguf(hf, path: str) -> None:
    c = hf.config
    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_block_count(LAYERS)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    w.add_expert_count(c.num_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_feed_forward_length(c.moe_intermediate_size)
    w.add_vocab_size(VOCAB)
    sd = {k: v.float().numpy() for k, v in hf.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "mlp.gate": "ffn_gate_inp"}
    for i in range(LAYERS):
        pre = f"model.layers.{i}."
        for hf_name, g in names.items():
            w.add_tensor(f"blk.{i}.{g}.weight", sd[f"{pre}{hf_name}.weight"])
        # [E, rows, n], one expert after another (transformers holds gate|up fused)
        gate_up, inter = sd[f"{pre}mlp.experts.gate_up_proj"], c.moe_intermediate_size
        stacks = {"gate": gate_up[:, :inter], "up": gate_up[:, inter:],
                  "down": sd[f"{pre}mlp.experts.down_proj"]}
        for proj, stack in stacks.items():
            w.add_tensor(f"blk.{i}.ffn_{proj}_exps.weight", np.ascontiguousarray(stack))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def moe_gguf(tmp_path_factory):
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, num_hidden_layers=LAYERS, intermediate_size=80, moe_intermediate_size=32,
        num_experts=EXPERTS, num_experts_per_tok=2, norm_topk_prob=True,
        max_position_embeddings=64, tie_word_embeddings=False, rope_theta=10000.0)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    _randomize(hf, seed=5)
    hf.eval()
    path = str(tmp_path_factory.mktemp("moe_gguf") / "tiny-qwen3moe.gguf")
    write_gguf(hf, path)
    return hf, path


def test_qwen3_moe_gguf_matches_transformers(moe_gguf):
    hf, path = moe_gguf
    model, params = models.load_model(path, dtype="float32")
    assert model.architecture == "Qwen3MoeForCausalLM"
    moe = model.abstract.moe
    assert (moe.num_experts, moe.top_k, moe.inter, moe.renormalize) == (EXPERTS, 2, 32, True)
    ids = [int(t) for t in np.random.default_rng(1).integers(0, VOCAB, 16)]
    runner = PagedRunner(model, params, seed=2)
    got = [runner.step([("s", ids[:11])])["s"]]
    for i in range(11, 16):
        got.append(runner.step([("s", ids[i:i + 1])])["s"])
    assert_close(np.concatenate(got), hf_logits(hf, ids), "qwen3moe gguf")


def test_gguf_moe_names():
    from pagedjax.models.loader import hf_to_gguf_name

    assert hf_to_gguf_name("model.layers.3.mlp.experts.5.down_proj.weight",
                           "qwen3moe") == "blk.3.ffn_down_exps.weight"
    assert hf_to_gguf_name("model.layers.0.mlp.gate.weight", "qwen3moe") == \
        "blk.0.ffn_gate_inp.weight"
    assert hf_to_gguf_name("model.layers.0.self_attn.q_norm.weight", "qwen3moe") == \
        "blk.0.attn_q_norm.weight"
