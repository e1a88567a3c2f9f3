"""Build a tiny Qwen2 model and tokenizer locally, for tests that need real transformers weights."""

from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "Justification: the tool fits. Context: none. Sub-Goal: compute it. Tool Name: python",
    "What is 17 * 23? The answer is 391. <answer>391</answer> Conclusion: STOP CONTINUE",
    "Analyze the question below before anyone tries to answer it. Available tools: memory.",
    '{"code": "print(17 * 23)"} {"query": "capital of France"} arguments schema',
]


def build_tiny_model(
    folder: Path,
    seed: int = 0,
    *,
    texts: list[str] | None = None,
    vocab_size: int = 400,
    hidden_size: int = 32,
    whole_text: bool = False,
    min_frequency: int = 0,
) -> Path:
    """Train a byte-level BPE on a few lines, build a tiny Qwen2, save both.

    With `whole_text`, merges may cross spaces and newlines, so text repeated across prompts,
    like a template, becomes a few long tokens and a tiny model sees short sequences. Load such
    a tokenizer with `PreTrainedTokenizerFast.from_pretrained`: `AutoTokenizer` would swap in
    Qwen2's own pre-tokenizer for a `qwen2` model folder. `min_frequency` keeps rare pairs
    (say, one question's words) from merging into the template around them.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not whole_text)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts or CORPUS * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        chat_template=CHATML,
    )
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
