"""The longest `--max-model-len` vLLM accepts for a model, read from its config.json (pure).

vLLM refuses a `--max-model-len` above the length it derives from the model's config when the
engine starts, after the pod was scheduled, the image pulled and the weights streamed. The
import checks the same rule on the config.json it copies, so a model that cannot start never
gets a manifest. The rule, as vLLM's main branch has it (read for the pinned v0.33.0 image; the
same steps as 0.11's, with the length keys moved to the architecture config:
`_get_and_verify_max_len` in
https://github.com/vllm-project/vllm/blob/main/vllm/config/model.py and
`derive_max_model_len_and_key` in vllm/transformers_utils/model_arch_config_convertor.py):

- the base is the smallest of the length keys present in the text config (LENGTH_KEYS), except
  that a truthy `model_max_length` replaces it (Command-R, Cohere);
- no length key at all: vLLM takes the user's value as it is (no limit);
- RoPE scaling (`rope_scaling`, or transformers v5's `rope_parameters`, possibly one per layer
  type): a type other than `su`, `longrope`, `llama3` multiplies the base by its `factor`
  (`linear`, `dynamic`, `yarn`...; a null factor is 1), and `yarn` multiplies its
  `original_max_position_embeddings` instead of the base; `llama3` and `longrope` configs already
  state the scaled length in `max_position_embeddings`; Gemma 3's model types are never scaled;
- a value above the limit still passes when it is at most the config's `model_max_length`, or
  when the engine's environment has VLLM_ALLOW_LONG_MAX_MODEL_LEN set (warmstart never sets it).

`--hf-overrides` (a JSON object among the model's extraArgs) is applied first as vLLM applies
it (`ModelConfig._apply_dict_overrides`): a key holding a nested config (`text_config`) is
merged into it, any other key is replaced; this is how a user turns on a model's YaRN scaling
(e.g. Qwen2.5's, https://huggingface.co/Qwen/Qwen2.5-7B-Instruct#processing-long-texts).

Not modelled (each can only lower vLLM's limit, or is for pooling models warmstart does not
serve): `--disable-sliding-window`, a pooling model's tokenizer_config.json or
sentence_bert_config.json.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

#: The keys vLLM reads a model's length from, in its order (the smallest present wins).
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
               "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
#: RoPE types whose factor vLLM does not multiply in: their configs state the scaled length.
UNSCALED_ROPE_TYPES = ("su", "longrope", "llama3")
#: What the fix suggests for a model whose RoPE scaling is off in its config.
HF_OVERRIDES_FLAG = "--hf-overrides"


@dataclasses.dataclass(frozen=True)
class ModelLength:
    """What vLLM derives from one config.json."""

    limit: float | None
    """The longest --max-model-len vLLM accepts (None: the config names no length, any passes)."""
    key: str | None
    """The config key the base length came from."""
    rope: str | None
    """How RoPE scaling entered the limit, in words (None: it did not)."""
    model_max_length: int | None
    """The config's own `model_max_length`, which vLLM also accepts a value up to."""

    def refuses(self, max_model_len: int, allow_long: bool = False) -> bool:
        """Whether vLLM refuses this --max-model-len at start-up."""
        if self.limit is None or allow_long or max_model_len <= self.limit:
            return False
        return self.model_max_length is None or max_model_len > self.model_max_length

    def describe(self) -> str:
        figure = f"{int(self.limit):,}" if self.limit is not None else "unbounded"
        why = f"{self.key}" + (f" with {self.rope}" if self.rope else "")
        return f"{figure} tokens ({why})"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a config: `text_config` in a multimodal model's config.json
    (Llama 4, Gemma 3, Qwen2.5-VL), else the config itself (vLLM's `get_hf_text_config`)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def apply_overrides(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The config after vLLM's dict `--hf-overrides`: keys holding nested configs (`*_config`
    objects) are merged recursively, the others replaced (a `rope_scaling` object is replaced
    whole)."""

    def merge(target: dict[str, Any], updates: Mapping[str, Any]) -> dict[str, Any]:
        for key, value in updates.items():
            if isinstance(value, dict) and isinstance(target.get(key), dict):
                target[key] = merge(dict(target[key]), value)
            else:
                target[key] = value
        return target

    out = dict(config)
    for key, value in overrides.items():
        if key.endswith("_config") and isinstance(out.get(key), dict) and isinstance(value, dict):
            out[key] = merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def _rope_entries(text: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """The RoPE settings, one per layer type (None: none). `rope_scaling` (transformers v4, and
    what --hf-overrides users write) before v5's `rope_parameters`; `type` is the old `rope_type`."""
    rope = text.get("rope_scaling") if isinstance(text.get("rope_scaling"), dict) else text.get("rope_parameters")
    if not isinstance(rope, dict) or not rope:
        return None
    nested = all(isinstance(v, dict) for v in rope.values()) and not ({"rope_type", "type"} & rope.keys())
    entries = list(rope.values()) if nested else [rope]
    return [{**e, "rope_type": e.get("rope_type", e.get("type", "default"))} for e in entries]


def derive(config: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> ModelLength:
    """vLLM's limit for a config.json's parsed object (see the module docstring)."""
    if overrides:
        config = apply_overrides(config, overrides)
    text = text_config(config)
    base, key = float("inf"), None
    for name in LENGTH_KEYS:
        value = _number(text.get(name))
        if value is not None and value < base:
            base, key = value, name
    model_max_length = _number(text.get("model_max_length"))
    if model_max_length:
        base, key = model_max_length, "model_max_length"
    if base == float("inf"):
        return ModelLength(None, None, None, None)
    rope_words = None
    entries = _rope_entries(text)
    if entries is not None and "gemma3" not in str(text.get("model_type", "")):
        factor, types = 1.0, sorted({str(e["rope_type"]) for e in entries})
        for entry in entries:
            if entry["rope_type"] in UNSCALED_ROPE_TYPES:
                continue
            if "factor" in entry:
                factor = _number(entry["factor"]) or 1.0
            if entry["rope_type"] == "yarn":
                original = _number(entry.get("original_max_position_embeddings")) \
                    or _number(text.get("original_max_position_embeddings"))
                if original is not None:
                    base, key = original, "original_max_position_embeddings"
        scaling = [t for t in types if t != "default"]
        if factor != 1.0:
            rope_words = f"{'/'.join(scaling)} RoPE scaling factor {factor:g}"
        elif scaling:
            rope_words = f"its {'/'.join(scaling)} RoPE scaling (already counted in {key})"
        base *= factor
    return ModelLength(base, key, rope_words, int(model_max_length) if model_max_length else None)


def hf_overrides(extra_args: list[str] | tuple[str, ...]) -> str | None:
    """The JSON text of `--hf-overrides` among vLLM arguments (`--hf-overrides X` or
    `--hf-overrides=X`; the last one wins, as with argparse), or None."""
    found = None
    for i, arg in enumerate(extra_args):
        if arg == HF_OVERRIDES_FLAG and i + 1 < len(extra_args):
            found = extra_args[i + 1]
        elif arg.startswith(HF_OVERRIDES_FLAG + "="):
            found = arg.split("=", 1)[1]
    return found


def parse_overrides(text: str) -> dict[str, Any] | None:
    """A JSON object's text as a dict; None when it is not one (vLLM refuses it at start-up)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def refusal(model: str, max_model_len: int, length: ModelLength, overridden: bool) -> str | None:
    """The one line an import fails with when vLLM would refuse `max_model_len` (None: it passes)."""
    if not length.refuses(max_model_len):
        return None
    fix = f"set models[].maxModelLen to at most {int(length.limit or 0)} for model {model}"
    if length.rope is None and not overridden:  # no scaling configured: the model card may give one
        fix += (", or, if the model documents a RoPE scaling for longer contexts, turn it on with extraArgs "
                f"[\"{HF_OVERRIDES_FLAG}\", '{{\"rope_scaling\": {{...}}}}'] as its model card says")
    return (f"{model}: models[].maxModelLen is {max_model_len:,} but the model's config.json allows at most "
            f"{length.describe()}{' after --hf-overrides' if overridden else ''}; vLLM would refuse to start "
            f"(_get_and_verify_max_len); fix: {fix}")
