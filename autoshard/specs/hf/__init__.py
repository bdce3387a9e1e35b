"""Import a Hugging Face transformers ``config.json`` as a :class:`ModelSpec`.

One converter per ``model_type``, each reading the field names that transformers itself uses for that
architecture (and its defaults when a field is absent, as ``from_pretrained`` would). Only the facts that
decide weight shapes, memory and FLOPs are read, and the RoPE base and rotated fraction the launch
command carries (``rope_theta``, ``partial_rotary_factor``, ``rope_scaling``: llama3, yarn, linear; another
scaling type is a warning naming it, rope.py); dropout and token ids are ignored.
Sliding windows (Mistral-7B-v0.1, Gemma 2/3's local layers, Qwen with use_sliding_window) become each layer
group's ``attention_window`` (window.py). Architectures whose attention or layer mix the schema cannot
describe (gpt-oss, Llama 4, Qwen3-Next, DeepSeek-V3.2, Mamba hybrids, ...) are refused with what they lack (importer.py `_NOT_MODELLED`), never imported as the nearest family. A
``quantization_config`` becomes the model's one `checkpoints:` entry (quant.py: FP8 with or without
128 x 128 block scales, int8/int4, NVFP4, MXFP4; anything else a warning, never an error); it is looked
for where vLLM looks: the top level, ``text_config`` (Kimi-K2.5), ``compression_config``, then ModelOpt's
``hf_quant_config.json`` beside config.json (the loader reads it).

Layouts read as transformers reads them: a multimodal wrapper imports its ``text_config`` (the other
towers, ``vision_config`` ..., are left out with a warning: their weights are not counted); transformers
v5's ``rope_parameters`` holds ``rope_theta`` / ``partial_rotary_factor`` when the top level does not (both,
different: refused naming both keys); an explicit null is "absent" (the family default applies) except
where the modeling code reads null as "none": DeepSeek's ``q_lora_rank`` (a dense query projection:
Moonlight, Kimi-VL) and ``n_shared_experts`` (no shared expert). ``num_hidden_layers`` above the schema's
1,024 is refused naming that key; a ``_name_or_path`` longer than a model name (200 characters) gives way
to the folder's name with a warning.

Which file owns what: importer.py picks the converter by ``model_type`` (`model_from_hf_config`);
quant.py reads ``quantization_config``; window.py the sliding windows; reader.py is the typed field reader and
the helpers every family shares; dense.py (Llama-like), gemma.py (Gemma 2/3), gpt.py (GPT-2/NeoX, BLOOM, OPT)
and moe.py (Mixtral, Qwen-MoE, DeepSeek, Kimi K2, GLM-4.5) hold the converters.
A new family is a converter in the file of its kind plus its ``model_type`` in that file's ``CONVERTERS`` table.

Where the schema cannot represent a detail exactly the importer approximates, and says so here:

* BLOOM's layernorm right after the word embedding (2*hidden parameters) has no field: it is not counted.
* OPT stores ``max_position_embeddings + 2`` learned position rows (fairseq's padding offset); the spec's
  ``max_position_embeddings`` is set to that row count so the parameter count is exact, which makes the
  advertised context two tokens longer than the real one.
* OPT with ``word_embed_proj_dim != hidden_size`` (opt-350m) has a narrower embedding plus two projections;
  the spec counts a full-width embedding instead and a :class:`UserWarning` says so.
* Biases: the spec knows "every linear layer" (``linear_bias``) or "only Q/K/V" (``qkv_bias``). Llama-style
  ``attention_bias`` (which also covers the output projection) maps to ``qkv_bias``; ``mlp_bias`` maps to
  ``linear_bias``. The difference is ``hidden`` parameters per layer.
* MoE router extras (Qwen2-MoE's 1-wide shared-expert gate, DeepSeek-V3's expert-score correction bias)
  are not counted in parameters. DeepSeek-V2/V3 routing is imported: ``scoring_func`` (sigmoid/softmax),
  group-limited routing (``n_group``, ``topk_group``; only with ``topk_method`` group_limited_greedy or
  noaux_tc), the auxiliary-loss-free expert bias (``topk_method: noaux_tc``) and ``routed_scaling_factor``.
  DeepSeek-V3's multi-token-prediction modules (``num_nextn_predict_layers``) become ``mtp_num_layers``:
  trained and costed, but outside ``num_params`` (the published 671B; the hub's 685B adds the 14B MTP
  module with its copies of the embedding and head).
"""

from autoshard.specs.hf.importer import SUPPORTED_MODEL_TYPES, model_from_hf_config

__all__ = ["model_from_hf_config", "SUPPORTED_MODEL_TYPES"]
