"""GGUF checkpoints as the reference engine loads them: dequantized once into a Hugging Face folder.

A `.gguf` file (or a folder holding exactly one, without a config.json) is read by transformers
(`gguf_file=`, dequantized to bf16) and saved with its tokenizer, chat template and generation config as
a plain folder under the cache (`$ZIPKV_CACHE_DIR`, default `~/.cache/zipkv`), `gguf/<stem>-<key>/`. The
key hashes the file's path, size and modification time, so a changed file converts again and an
unchanged one loads the cached folder at once. Needs the `gguf` and `accelerate` packages
(`pip install 'zipkv[gguf]'`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

CACHE_ENV = "ZIPKV_CACHE_DIR"


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "zipkv")


def gguf_file(path: str | Path) -> Path | None:
    """The GGUF file ``path`` names (itself, or the one in a folder without config.json), else None."""
    p = Path(path)
    if p.is_file() and p.suffix == ".gguf":
        return p
    if p.is_dir() and not (p / "config.json").is_file():
        found = sorted(p.glob("*.gguf"))
        if len(found) > 1:
            names = [f.name for f in found]
            raise ValueError(f"{p} holds {len(found)} GGUF files {names}: give the path of one of them")
        return found[0] if found else None
    return None


def converted_folder(file: Path, cache_dir: Path) -> Path:
    stat = file.stat()
    key = hashlib.sha256(f"{file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_dir / "gguf" / f"{file.stem}-{key}"


def resolve_model_path(
    path: str, cache_dir: Path | None = None, progress: Callable[[str], None] = print
) -> str:
    """``path`` itself for a Hugging Face folder; for a GGUF, its dequantized folder (converted once)."""
    file = gguf_file(path)
    if file is None:
        return path
    folder = converted_folder(file, cache_dir or default_cache_dir())
    if not (folder / "config.json").is_file():
        progress(f"dequantizing {file.name} into {folder} (once; later starts reuse it)")
        dequantize(file, folder)
    return str(folder)


def dequantize(file: Path, folder: Path) -> None:
    """Write ``file``'s model, dequantized to bf16, and its tokenizer as a Hugging Face folder (atomic:
    built beside it and renamed, so a half-written folder is never taken for a converted one)."""
    try:
        import gguf  # noqa: F401  (transformers needs it for gguf_file=)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise RuntimeError(f"loading a GGUF needs `pip install 'zipkv[gguf]'` ({exc})") from None
    kwargs: dict[str, object] = {"gguf_file": file.name, "dtype": torch.bfloat16}
    try:  # transformers 5 keeps GGUF weights packed unless asked to dequantize
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # transformers 4 always dequantizes
        pass
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(file.parent), **kwargs)
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name).save_pretrained(tmp)
        if folder.exists():  # another process converted it meanwhile: keep theirs
            return
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
