"""Local stand-ins for what the documentation's script downloads: a tiny Llama and WikiText-like text.

``prepare(directory)`` writes, once:

* ``text/train.txt`` and ``text/validation.txt``: generated English-like sentences;
* ``model/``: a tokenizer trained on that text (``tokenizers`` BPE wrapped in
  ``PreTrainedTokenizerFast``) and a tiny ``LlamaForCausalLM`` built from a config, saved with
  ``save_pretrained`` so ``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained(path,
  local_files_only=True)`` load it exactly as the script loads Llama-3.2-1B.

Nothing is downloaded.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

_SUBJECTS = ["the model", "a checkpoint", "the trainer", "every node", "the cluster", "our job", "the optimizer"]
_VERBS = ["writes", "reads", "saves", "restores", "trains", "schedules", "measures", "resumes"]
_OBJECTS = ["the weights", "a gradient", "the loss", "many tokens", "the disk", "a shard", "the learning rate"]
_TAILS = ["quickly .", "after each step .", "without stopping .", "on the host .", "in the background .", "again ."]


def _sentences(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join((rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS), rng.choice(_TAILS))) for _ in range(count)]


def prepare(directory: str | os.PathLike[str], *, train_lines: int = 400, validation_lines: int = 40) -> dict[str, str]:
    """Writes the text data, tokenizer and tiny model under ``directory`` (idempotent).

    Returns:
        Paths: ``model``, ``train``, ``validation``.
    """
    root = Path(directory)
    text_dir, model_dir = root / "text", root / "model"
    paths = {
        "model": str(model_dir),
        "train": str(text_dir / "train.txt"),
        "validation": str(text_dir / "validation.txt"),
    }
    if (model_dir / "config.json").is_file() and Path(paths["validation"]).is_file():
        return paths
    text_dir.mkdir(parents=True, exist_ok=True)
    Path(paths["train"]).write_text("\n".join(_sentences(train_lines, seed=1)) + "\n")
    Path(paths["validation"]).write_text("\n".join(_sentences(validation_lines, seed=2)) + "\n")

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train([paths["train"]], trainers.BpeTrainer(vocab_size=256, special_tokens=["<unk>", "<s>", "</s>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(model_dir)

    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(model_dir)
    return paths


if __name__ == "__main__":
    import sys

    print(prepare(sys.argv[1] if len(sys.argv) > 1 else "offline_assets"))
