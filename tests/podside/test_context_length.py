"""vLLM's `--max-model-len` rule on public config.json shapes (warmstart/podside/weights_import/
context_length.py), each against the figure vLLM's `_get_and_verify_max_len` (vllm/config/model.py) gives.

The configs keep the keys the rule reads, as the models publish them (their config.json on the
Hugging Face Hub, linked per model)."""

from __future__ import annotations

import pytest

from warmstart.podside.weights_import.context_length import derive, hf_overrides, parse_overrides, refusal

# https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/config.json
LLAMA_31_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "max_position_embeddings": 131072,
               "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"},
               "rope_theta": 500000.0}
# https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json (YaRN is off; its model
# card's "Processing Long Texts" adds the rope_scaling below for 131,072 tokens).
QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "max_position_embeddings": 32768,
             "rope_theta": 1000000.0, "sliding_window": 131072, "use_sliding_window": False}
QWEN_YARN = {"rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}}
# https://huggingface.co/mistralai/Mistral-7B-Instruct-v0.3/blob/main/config.json (no RoPE scaling)
MISTRAL_7B = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "max_position_embeddings": 32768,
              "rope_theta": 1000000.0, "sliding_window": None}
# https://huggingface.co/microsoft/Phi-3-mini-128k-instruct/blob/main/config.json (longrope: the
# 128k is max_position_embeddings itself, the factors are per frequency lists)
PHI3_128K = {"model_type": "phi3", "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
             "rope_scaling": {"long_factor": [1.0, 1.1], "short_factor": [1.0, 1.0], "type": "longrope"}}
# https://huggingface.co/google/gemma-3-27b-it/blob/main/config.json (its 128k already includes
# the linear factor 8; vLLM skips Gemma 3's factor)
GEMMA3_27B = {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "max_position_embeddings": 131072,
                                                      "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}}
# https://huggingface.co/openai-community/gpt2/blob/main/config.json
GPT2 = {"model_type": "gpt2", "n_positions": 1024, "n_ctx": 1024}


@pytest.mark.parametrize(("config", "overrides", "limit"), [
    (LLAMA_31_8B, None, 131072),          # llama3: not multiplied by its factor 8
    (QWEN25_7B, None, 32768),
    (QWEN25_7B, QWEN_YARN, 131072),       # yarn: original_max_position_embeddings x 4
    (MISTRAL_7B, None, 32768),
    (PHI3_128K, None, 131072),            # longrope: not multiplied
    (GEMMA3_27B, None, 131072),           # text_config, Gemma 3 not multiplied
    (GPT2, None, 1024),                   # n_positions
    # A linear factor multiplies max_position_embeddings (transformers' "linear" and "dynamic").
    ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}}, None, 8192),
    # transformers v5 writes rope_parameters, with rope_type "default" and no factor: 1.
    ({"max_position_embeddings": 40960, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, None, 40960),
    # rope_parameters per layer type (transformers v5): one factor for all.
    ({"max_position_embeddings": 8192, "rope_parameters": {
        "full_attention": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096},
        "sliding_attention": {"rope_type": "default"}}}, None, 8192),
    # A null factor is 1 (vLLM warns and falls back).
    ({"max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic", "factor": None}}, None, 4096),
    # The smallest length key wins; a truthy model_max_length replaces it (Command-R).
    ({"max_position_embeddings": 8192, "seq_length": 4096}, None, 4096),
    ({"max_position_embeddings": 8192, "model_max_length": 131072}, None, 131072),
])
def test_the_limit_is_vllms(config, overrides, limit):
    assert derive(config, overrides).limit == limit


def test_a_config_without_a_length_key_has_no_limit():
    # vLLM takes the user's value as it is then (it only warns when none is given).
    length = derive({"architectures": ["X"]})
    assert length.limit is None and not length.refuses(10**8)


def test_the_refusal_names_the_key_the_figure_the_limit_and_the_fix():
    line = refusal("qwen", 131072, derive(QWEN25_7B), overridden=False)
    assert line is not None and "\n" not in line
    assert "models[].maxModelLen is 131,072" in line and "at most 32,768 tokens (max_position_embeddings)" in line
    assert "set models[].maxModelLen to at most 32768 for model qwen" in line and "--hf-overrides" in line
    # Within the limit, or with the model card's YaRN turned on: no refusal.
    assert refusal("qwen", 32768, derive(QWEN25_7B), overridden=False) is None
    assert refusal("qwen", 131072, derive(QWEN25_7B, QWEN_YARN), overridden=True) is None
    over = refusal("qwen", 200000, derive(QWEN25_7B, QWEN_YARN), overridden=True)
    assert over is not None and "yarn RoPE scaling factor 4" in over and "after --hf-overrides" in over
    # A model whose RoPE scaling is already on is told only to lower it.
    llama = refusal("llama", 262144, derive(LLAMA_31_8B), overridden=False)
    assert llama is not None and "--hf-overrides" not in llama and "at most 131072" in llama
    assert "llama3 RoPE scaling (already counted in max_position_embeddings)" in llama


def test_model_max_length_and_the_environment_escape_let_a_longer_value_pass():
    # vLLM accepts a value above the derived length up to the config's model_max_length, and any
    # value with VLLM_ALLOW_LONG_MAX_MODEL_LEN (which warmstart never sets on the engine).
    length = derive({"max_position_embeddings": 4096, "rope_scaling": {"type": "yarn", "factor": 2.0,
                                                                        "original_max_position_embeddings": 2048},
                     "model_max_length": 10000})
    assert length.limit == 4096 and not length.refuses(10000) and length.refuses(10001)
    assert derive(MISTRAL_7B).refuses(32769) and not derive(MISTRAL_7B).refuses(32769, allow_long=True)


def test_hf_overrides_are_applied_as_vllm_does():
    # A nested config is merged; any other key (rope_scaling) is replaced whole.
    merged = derive(GEMMA3_27B, {"text_config": {"max_position_embeddings": 8192}})
    assert merged.limit == 8192
    replaced = derive(LLAMA_31_8B, {"rope_scaling": {"type": "linear", "factor": 2.0}})
    assert replaced.limit == 262144


@pytest.mark.parametrize(("args", "found"), [
    ([], None),
    (["--hf-overrides", '{"a": 1}'], '{"a": 1}'),
    (['--hf-overrides={"a": 1}'], '{"a": 1}'),
    (["--hf-overrides", "{}", '--hf-overrides={"b": 2}'], '{"b": 2}'),
    (["--enable-prefix-caching"], None),
])
def test_hf_overrides_are_found_among_extra_args(args, found):
    assert hf_overrides(args) == found


def test_only_a_json_object_is_an_override():
    assert parse_overrides('{"rope_scaling": null}') == {"rope_scaling": None}
    assert parse_overrides("[1]") is None and parse_overrides("{nope") is None
