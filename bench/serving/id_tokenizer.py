"""A tokenizer for dummy-weight serving benchmarks: every id renders as the word `t<id>`.

The serving sweep sends token-id prompts to models with random weights, which generate ids of every kind;
the byte tokenizer (or a real one with special tokens) renders many of them as nothing, and a streaming
client counts a token only when its chunk carries text (SGLang bench_serving does). With this tokenizer
every generated id becomes one non-empty word, so each token is seen when it arrives, the same on every
system: the zipkv router (the `tokenizers` package) and SGLang's server and bench_serving (transformers'
PreTrainedTokenizerFast) load the same folder. No id is special, so EOS never ends a stream early either
(the sweep sets ignore_eos anyway).

    python -m bench.serving.id_tokenizer --vocab-size 128256 --out /tmp/id_tokenizer  # Llama-3.1-8B's vocab
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def build(vocab_size: int, out: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    if vocab_size < 2:
        raise ValueError(f"vocab size must be >= 2, got {vocab_size}")
    out.mkdir(parents=True, exist_ok=True)
    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.serving.id_tokenizer", description=__doc__.split("\n")[0]
    )
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    print(build(args.vocab_size, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
