"""Build a tiny random-weight Llama with its own BPE tokenizer for the vLLM e2e tests.

Run with the vLLM venv's interpreter (it needs torch, transformers and tokenizers):

    .venv-vllm/bin/python tests/e2e/make_tiny_model.py [--out .cache/tiny-llama]

The model is nonsense by design: it exists so that a real vLLM server can load, schedule
and stream tokens on a CPU in seconds. head_dim is 64 because the CPU attention kernel
rejects smaller heads. Idempotent: a complete directory built from the same recipe is
left alone.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / ".cache" / "tiny-llama"

# Bump when anything below changes, so that old directories are rebuilt.
RECIPE = {
    "recipe": 2,
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "dtype": "bfloat16",
    "seed": 1234,
}
MARKER = "tiny-llama-recipe.json"
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]

_WORD_TEXT = (
    "the a gpu node serves tokens memory cache block prefix request queue batch kernel "
    "latency throughput model layer head attention decode prefill scheduler worker engine "
    "fragment allocator free large small segment stream warm cold fast slow busy idle "
    "alpha beta gamma delta one two three four five six seven eight nine ten and or of to"
)
WORDS = _WORD_TEXT.split(" ")


def corpus(n_lines: int, seed: int) -> list[str]:
    """Deterministic word salad: enough variety for a few hundred BPE merges."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        n = rng.randint(4, 16)
        words = [rng.choice(WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 9999)))
        lines.append(" ".join(words) + rng.choice([".", "!", "?", ","]))
    return lines


def is_complete(out: Path) -> bool:
    marker = out / MARKER
    if not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text())
    except ValueError:
        return False
    needed = ["config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"]
    return recorded == RECIPE and all((out / name).is_file() for name in needed)


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    seed = int(RECIPE["seed"])
    vocab_size = int(RECIPE["vocab_size"])

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus(4000, seed), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        model_max_length=int(RECIPE["max_position_embeddings"]),
    )

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=bpe.get_vocab_size(),
        hidden_size=int(RECIPE["hidden_size"]),
        intermediate_size=int(RECIPE["intermediate_size"]),
        num_hidden_layers=int(RECIPE["num_hidden_layers"]),
        num_attention_heads=int(RECIPE["num_attention_heads"]),
        num_key_value_heads=int(RECIPE["num_key_value_heads"]),
        max_position_embeddings=int(RECIPE["max_position_embeddings"]),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)

    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".tiny-llama-", dir=out.parent))
    try:
        model.save_pretrained(work, safe_serialization=True)
        tokenizer.save_pretrained(work)
        (work / MARKER).write_text(json.dumps(RECIPE, indent=2, sort_keys=True) + "\n")
        if out.exists():
            shutil.rmtree(out)
        work.rename(out)
    finally:
        if work.exists():
            shutil.rmtree(work)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="model directory")
    parser.add_argument("--force", action="store_true", help="rebuild even if complete")
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    if is_complete(out) and not args.force:
        print(f"tiny model: {out} is complete")
        return 0
    build(out)
    print(f"tiny model: built {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
