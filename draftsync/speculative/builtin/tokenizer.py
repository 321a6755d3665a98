"""A byte-level BPE tokenizer for the built-in targets, trained locally with `tokenizers`, and its chat template."""

from __future__ import annotations

from pathlib import Path

EOS = "<|endoftext|>"  # the one special token: end of text, also BOS and padding

# The chat template: each turn `Role: content` on its own line, an assistant turn ended by EOS (where a generated
# answer ends), and `Assistant:` as the generation prompt. Plain text the byte-level tokenizer encodes, EOS aside, in
# the shape of the corpus's `Question: ...\nAnswer:` dialogues, so the targets answer after it; the targets never
# trained on it. transformers 5 saves it as chat_template.jinja beside tokenizer_config.json, where transformers'
# AutoTokenizer (and so vLLM's /v1/chat/completions) reads it.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "{{- (message['role'] | capitalize) + ': ' + (message['content'] or '') + '\\n' -}}\n"
    "{%- if message['role'] == 'assistant' -%}{{- eos_token -}}{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- 'Assistant:' -}}{%- endif -%}\n"
)
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # the file transformers' save_pretrained writes it to


def with_chat_template(tokenizer):
    """`tokenizer` with the built-in chat template set (saved with it by `save_pretrained`)."""
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def write_chat_template(checkpoint_dir: Path) -> bool:
    """Give a saved built-in checkpoint or tokenizer the chat template (one saved before it had one: the template is
    no part of what trains the weights, so a cached build keeps its folder); True when the file was (re)written."""
    from draftsync.files import atomic_write

    path = Path(checkpoint_dir) / CHAT_TEMPLATE_FILE
    if path.is_file() and path.read_text() == CHAT_TEMPLATE:
        return False
    atomic_write(path, lambda tmp: tmp.write_text(CHAT_TEMPLATE))
    return True


def train_tokenizer(texts: list[str], vocab_size: int, out_dir: Path):
    """Train, wrap as a transformers fast tokenizer and save to `out_dir`; returns the wrapped tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS)
    with_chat_template(wrapped)
    out_dir.mkdir(parents=True, exist_ok=True)
    wrapped.save_pretrained(out_dir)
    return wrapped
