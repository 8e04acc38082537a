"""A tiny random Qwen3 target with a locally built tokenizer, for demos and tests (nothing is downloaded)."""
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


def build_tokenizer(vocab_size: int):
    """A byte-level BPE trained in memory, wrapped as a transformers fast tokenizer with a chat template."""
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
    core.train_from_iterator(tokenizer_corpus(), trainer=trainer)
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


def write_tiny_target(out_dir: Path, *, seed: int = 0, vocab_size: int = 320, hidden_size: int = 64,
                      num_layers: int = 6, num_heads: int = 4, num_kv_heads: int = 2, head_dim: int = 16,
                      intermediate_size: int = 128, max_position_embeddings: int = 4096,
                      initializer_range: float = 0.1) -> Path:
    """Write a tiny random Qwen3ForCausalLM and its tokenizer to `out_dir`; the same seed gives the same weights.

    `initializer_range` is larger than Qwen3's 0.02 so that the random target's next-token choice depends
    clearly on its context (near-uniform logits would make its greedy outputs degenerate).
    """
    import torch
    from transformers import Qwen3ForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    config = tiny_qwen3_config(
        tokenizer, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings, initializer_range=initializer_range,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
