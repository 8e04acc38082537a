"""Tiny random targets with a locally built tokenizer, for demos and tests (nothing is downloaded): a Qwen3, and
Qwen3.5-style hybrids (dense or MoE, text-only or a composite image-text checkpoint) whose layers are three Gated
DeltaNet linear-attention layers to every full-attention one, as the real Qwen3.5/3.6 models are."""
from __future__ import annotations

import itertools
from pathlib import Path

MASK_TOKEN = "<|MASK|>"
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END, MASK_TOKEN]

# ChatML, as Qwen3 uses it; `add_generation_prompt` opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "sh", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
_CODAS = ["", "n", "r", "s", "t", "l"]


def tokenizer_corpus(num_words: int = 400) -> list[str]:
    """A fixed list of pseudo-words (no randomness: the tokenizer is the same for every seed)."""
    syllables = ["".join(parts) for parts in itertools.product(_ONSETS, _VOWELS, _CODAS)]
    words = [syllables[(7 * i) % len(syllables)] + syllables[(13 * i + 5) % len(syllables)]
             for i in range(num_words)]
    lines = [" ".join(words[i:i + 12]) + "." for i in range(0, num_words, 12)]
    return lines + ["user assistant system: Hello, what is 1 + 2? It is 3!"]


def build_tokenizer(vocab_size: int, *, corpus: list[str] | None = None):
    """A byte-level BPE trained in memory (on `corpus`, default the fixed pseudo-words), wrapped as a
    transformers fast tokenizer with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(tokenizer_corpus() if corpus is None else corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        mask_token=MASK_TOKEN,
        additional_special_tokens=[IM_START],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_qwen3_config(tokenizer, *, hidden_size: int, num_layers: int, num_heads: int,
                      num_kv_heads: int, head_dim: int, intermediate_size: int,
                      max_position_embeddings: int, initializer_range: float):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        initializer_range=initializer_range,
        # untied on purpose: a drafter that used the embedding in place of the LM head would show in tests
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


FAMILIES = ("qwen3", "qwen3.5", "qwen3.5-moe")


def tiny_qwen3_5_text_config(tokenizer, *, moe: bool, num_layers: int = 8, initializer_range: float = 0.1):
    """A hybrid text config: every 4th layer full attention (gated), the others Gated DeltaNet."""
    from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(num_layers)]
    common = dict(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=num_layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, max_position_embeddings=4096,
        rms_norm_eps=1e-6, initializer_range=initializer_range, tie_word_embeddings=False, layer_types=layer_types,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        bos_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN), eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    if moe:
        return Qwen3_5MoeTextConfig(**common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                    shared_expert_intermediate_size=32)
    return Qwen3_5TextConfig(**common, intermediate_size=128)


def _tiny_hybrid(tokenizer, *, moe: bool, composite: bool, initializer_range: float):
    """The model object (random weights drawn under the caller's seed)."""
    import transformers as tf

    text = tiny_qwen3_5_text_config(tokenizer, moe=moe, initializer_range=initializer_range)
    if not composite:
        return (tf.Qwen3_5MoeForCausalLM if moe else tf.Qwen3_5ForCausalLM)(text)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=text.hidden_size)
    config_class = tf.Qwen3_5MoeConfig if moe else tf.Qwen3_5Config
    config = config_class(text_config=text.to_dict(), vision_config=vision, tie_word_embeddings=False)
    return (tf.Qwen3_5MoeForConditionalGeneration if moe else tf.Qwen3_5ForConditionalGeneration)(config)


def write_tiny_target(out_dir: Path, *, family: str = "qwen3", composite: bool = False, seed: int = 0,
                      vocab_size: int = 320, hidden_size: int = 64,
                      num_layers: int = 6, num_heads: int = 4, num_kv_heads: int = 2, head_dim: int = 16,
                      intermediate_size: int = 128, max_position_embeddings: int = 4096,
                      initializer_range: float = 0.1) -> Path:
    """Write a tiny random target of `family` (FAMILIES) and its tokenizer to `out_dir`; the same seed gives the
    same weights. `composite` writes a Qwen3.5 image-text checkpoint (a small vision tower, the text weights under
    model.language_model.); the sizes after `vocab_size` are the Qwen3 target's.

    `initializer_range` is larger than Qwen3's 0.02 so that the random target's next-token choice depends
    clearly on its context (near-uniform logits would make its greedy outputs degenerate).
    """
    import torch
    from transformers import Qwen3ForCausalLM

    from trainer.model.drafter_files import make_readable

    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: one of {', '.join(FAMILIES)}")
    if composite and family == "qwen3":
        raise ValueError("a composite checkpoint is a Qwen3.5 one: give family qwen3.5 or qwen3.5-moe")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if family == "qwen3":
            model = Qwen3ForCausalLM(tiny_qwen3_config(
                tokenizer, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                num_kv_heads=num_kv_heads, head_dim=head_dim, intermediate_size=intermediate_size,
                max_position_embeddings=max_position_embeddings, initializer_range=initializer_range))
        else:
            model = _tiny_hybrid(tokenizer, moe=family == "qwen3.5-moe", composite=composite,
                                 initializer_range=initializer_range)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    for path in out_dir.iterdir():
        if path.is_file():
            make_readable(path)  # the weights: save_pretrained goes through safetensors, which writes 0o600
    return out_dir

