"""Real text → one token stream, tokenized once and cached (docs/models-and-data.md §12). No torch.

`--data PATH` is a `.jsonl` file (one document per line, its `text` field), a `.txt` file
(the whole file is one document) or a folder of them (files in sorted name order). Every
document is tokenized with the model folder's `tokenizer.json` (the `tokenizers` library)
without special tokens and followed by the config's eos_token_id; the documents in order form
one stream, written once as a flat uint32 file under the cache folder, named by a key over
the files' sha256, the tokenizer's and the eos id (a changed file or tokenizer is a new
cache), and read by every rank as a memory map (`runtime.model.data.TokenStreamSource`).

*The `tokenizers` library, not `datasets`.* Reading .jsonl and .txt is a few lines, and one
flat memory-mapped array is all the §12 order needs (sequence j of step t is a slice at an
offset computed from (t, j)); `datasets` would add pyarrow, its own cache layout and a
dependency tree several times the project's, for an Arrow table that would still have to
be flattened into that one stream. `encode_batch` tokenizes batches of documents on every
core (the library's Rust threads).

A `.txt` file larger than PIECE_CHARS is encoded in pieces cut after a newline, so that a
100 MB file neither waits on one core nor shows no progress: equal to encoding it whole for
tokenizers whose pre-tokenizer splits at newlines (byte-level BPE: Llama 3, Qwen2, GPT-2, the
tests' own), which tests/test_hf_training.py checks.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from planner.hf_config import HFConfigError, eos_token_id
from runtime.errors import RunError
from runtime.hashing import file_sha256  # noqa: F401 (re-exported: callers read it here)

CACHE_ENV = "HEXISCALE_CACHE"
SUFFIXES = (".jsonl", ".txt")
PIECE_CHARS = 1 << 20  # a long .txt is encoded in pieces of about 1 MiB cut after a newline
BATCH_CHARS = 8 << 20  # documents encoded together (encode_batch), about 8 MiB of text
PROGRESS_BYTES = 16 << 20  # corpora from this size on report progress
PROGRESS_EVERY_S = 2.0
TOKEN_DTYPE = np.uint32


class DataError(RunError):
    """Text that cannot be trained on; the message names the file (and line) and why."""


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "hexiscale") / "tokens"


def corpus_files(path: str | Path) -> list[Path]:
    """The corpus's files: the .jsonl or .txt file given, or those of a folder in sorted name order."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in SUFFIXES)
        if not files:
            raise DataError(f"{path}: no .jsonl or .txt file in this folder")
        return files
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if path.suffix not in SUFFIXES:
        raise DataError(f"{path}: expected a .jsonl or .txt file, or a folder of them")
    return [path]


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _txt_pieces(text: str) -> Iterator[str]:
    """A document's text in pieces of about PIECE_CHARS, each cut after a newline."""
    start = 0
    while len(text) - start > PIECE_CHARS:
        cut = text.find("\n", start + PIECE_CHARS)
        if cut < 0:
            break
        yield text[start:cut + 1]
        start = cut + 1
    yield text[start:]


def _jsonl_documents(path: Path, text: str) -> Iterator[str]:
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{number}: not a JSON line ({exc.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise DataError(f"{path}:{number}: text: field required (a string) in every line")
        yield record["text"]


def documents(files: list[Path]) -> Iterator[tuple[str, bool]]:
    """(text, whether a document ends with it) of every piece of every document, in order."""
    for path in files:
        text = _read_text(path)
        if path.suffix == ".txt":
            pieces = list(_txt_pieces(text))
            yield from ((piece, i == len(pieces) - 1) for i, piece in enumerate(pieces))
        else:
            yield from ((doc, True) for doc in _jsonl_documents(path, text))


def cache_key(files: list[Path], tokenizer_file: Path, eos: int) -> str:
    """sha256 over the files (name and bytes, in order), the tokenizer and the eos id."""
    digest = hashlib.sha256(f"hexiscale.tokens/1 eos={eos}\n".encode())
    digest.update(file_sha256(tokenizer_file).encode())
    for path in files:
        digest.update(f"{path.name}\n{file_sha256(path)}\n".encode())
    return digest.hexdigest()[:24]


class Progress:
    """Tokenizing progress on stderr for long corpora: MB done, tokens/s, ETA (by characters)."""

    def __init__(self, total_bytes: int, log: Callable[[str], None] | None):
        self.total, self.log = total_bytes, log if total_bytes >= PROGRESS_BYTES else None
        self.start = self.last = time.monotonic()
        self.chars = self.tokens = 0

    def update(self, chars: int, tokens: int) -> None:
        self.chars, self.tokens = self.chars + chars, self.tokens + tokens
        now = time.monotonic()
        if self.log and now - self.last >= PROGRESS_EVERY_S:
            self.last, rate = now, self.tokens / (now - self.start)
            done = min(self.chars / self.total, 1.0)
            eta = (now - self.start) * (1 - done) / done if done else float("nan")
            self.log(f"tokenizing: {self.chars / 1e6:,.0f} of {self.total / 1e6:,.0f} MB, {self.tokens:,} tokens, "
                     f"{rate:,.0f} tokens/s, ETA {eta:.0f} s")


def tokenize_to(files: list[Path], tokenizer, eos: int, out: Path, progress: Progress) -> int:
    """Write the stream (uint32 ids; eos after every document) to `out`; returns its length."""
    count, batch, batch_chars = 0, [], 0
    with out.open("wb") as handle:
        def flush() -> None:
            nonlocal count, batch, batch_chars
            encoded = tokenizer.encode_batch([text for text, _ in batch], add_special_tokens=False)
            ids = [i for (_, ends), e in zip(batch, encoded) for i in (*e.ids, *((eos,) if ends else ()))]
            handle.write(np.asarray(ids, dtype=TOKEN_DTYPE).tobytes())
            count += len(ids)
            progress.update(batch_chars, len(ids))
            batch, batch_chars = [], 0

        for text, ends in documents(files):
            batch.append((text, ends))
            batch_chars += len(text) + 1
            if batch_chars >= BATCH_CHARS:
                flush()
        flush()
        handle.flush()
        os.fsync(handle.fileno())
    return count


class TokenStream:
    """A tokenized corpus on disk: the flat uint32 file, its length, its key."""

    def __init__(self, path: Path, tokens: int):
        self.path, self.tokens, self.key = path, tokens, path.stem

    def check_length(self, seq_len: int, option: str) -> None:
        """§12's offsets need len − s − 1 ≥ 1: at least one sequence and one more token."""
        if self.tokens < seq_len + 2:
            raise DataError(f"{option}: the corpus has {self.tokens} tokens, fewer than one sequence of "
                            f"{seq_len} + 2 (an input and its next-token targets)")


def load_tokenizer(model_folder: Path, vocab: int) -> tuple[object, Path, int]:
    """(tokenizer, its file, eos id) of a model folder; a vocabulary or eos beyond V is refused."""
    from tokenizers import Tokenizer  # the Rust library: only when text is tokenized

    file = model_folder / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(file))
        eos = eos_token_id(model_folder)
    except HFConfigError as exc:
        raise DataError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - the library's own error type: named in one line
        raise DataError(f"{file}: cannot read the tokenizer ({str(exc).splitlines()[0][:200]})") from None
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > vocab:
        raise DataError(f"{file}: the tokenizer has {size} tokens, more than the model's vocab_size {vocab}")
    if eos is None or eos >= vocab:
        raise DataError(f"{model_folder / 'config.json'}: eos_token_id: "
                        + ("field required (it ends every document of --data)" if eos is None
                           else f"{eos} is outside the vocabulary ({vocab})"))
    return tokenizer, file, eos


def prepare_stream(path: str | Path, model_folder: str | Path, vocab: int,
                   log: Callable[[str], None] | None = None) -> TokenStream:
    """The corpus at `path` as a token stream, from the cache when this corpus and tokenizer
    were tokenized before; `log` hears what happens (progress on long corpora)."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    files = corpus_files(path)
    tokenizer, tokenizer_file, eos = load_tokenizer(Path(model_folder), vocab)
    folder = cache_root()
    stream = folder / f"{cache_key(files, tokenizer_file, eos)}.bin"
    if stream.is_file():
        tokens = stream.stat().st_size // np.dtype(TOKEN_DTYPE).itemsize
        log(f"tokens of {path}: {tokens:,} (cached in {stream})")
        return TokenStream(stream, tokens)
    folder.mkdir(parents=True, exist_ok=True)
    partial = stream.with_suffix(f".partial-{os.getpid()}")
    start = time.monotonic()
    progress = Progress(sum(f.stat().st_size for f in files), log)
    try:
        tokens = tokenize_to(files, tokenizer, eos, partial, progress)
        if tokens == 0:
            raise DataError(f"{path}: the corpus is empty (no text to tokenize)")
    except BaseException:  # a bad line, an empty corpus, ^C: no cache of a part of it
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, stream)
    seconds = time.monotonic() - start
    log(f"tokenized {path}: {tokens:,} tokens in {seconds:.1f} s ({tokens / max(seconds, 1e-9):,.0f} tokens/s), "
        f"cached in {stream}")
    return TokenStream(stream, tokens)
