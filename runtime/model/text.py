"""Real text → one token stream, tokenized once and cached (docs/models-and-data.md §12). No torch.

`--data PATH` is a `.jsonl` file (one document per line, its `text` field), a `.txt` file
(the whole file is one document; one of whitespace only is none) or a folder of them (files in
sorted name order, the suffix in any case; what else the folder holds is named as passed
over). Every
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
import tempfile
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


def cache_folder() -> Path:
    """cache_root(), made; a $HEXISCALE_CACHE that cannot hold it (a file, no permission) is
    one line naming the variable, not an OSError from deep inside the tokenizing."""
    folder = cache_root()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()  # writable: os.access passes anything for root
    except OSError as exc:
        where = f"{CACHE_ENV}: {os.environ[CACHE_ENV]}" if os.environ.get(CACHE_ENV) else str(folder)
        raise DataError(f"{where}: cannot make the token cache folder {folder} ({exc.strerror or exc}); "
                        f"{CACHE_ENV} must name a folder") from None
    return folder


def suffix(path: Path) -> str:
    """.jsonl or .txt in any case (a folder's `NOTES.TXT` is text as `notes.txt` is)."""
    return path.suffix.lower()


def _skip_reason(path: Path) -> str | None:
    """Why a folder's entry is not read (None: it is)."""
    if path.is_symlink() and not path.exists():
        return "a broken link"
    if path.is_dir():
        return "a folder (subfolders are not read)"
    if not path.is_file():
        return "not a regular file"
    return None if suffix(path) in SUFFIXES else "not .jsonl or .txt"


def folder_files(folder: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(the files read, in sorted name order; every entry passed over, with why)."""
    files, skipped = [], []
    for path in sorted(folder.iterdir()):
        reason = _skip_reason(path)
        if reason is None:
            files.append(path)
        elif not path.name.startswith("."):  # hidden files (.DS_Store, editors' swap files) go unsaid
            skipped.append((path, reason))
    if not files:
        raise DataError(f"{folder}: no .jsonl or .txt file in this folder"
                        + (f" (passed over: {_listing(skipped)})" if skipped else ""))
    return files, skipped


def _listing(skipped: list[tuple[Path, str]]) -> str:
    return "; ".join(f"{path.name}: {reason}" for path, reason in skipped)


def corpus_files(path: str | Path, log: Callable[[str], None] | None = None) -> list[Path]:
    """The corpus's files: the .jsonl or .txt file given, or those of a folder in sorted name
    order; for a folder, `log` hears how many are read and which entries are not, and why."""
    path = Path(path)
    if path.is_dir():
        files, skipped = folder_files(path)
        if log:
            names = ", ".join(f.name for f in files)
            log(f"{path}: reading {len(files)} file{'s' if len(files) != 1 else ''} ({names})"
                + (f"; passed over {_listing(skipped)}" if skipped else ""))
        return files
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if suffix(path) not in SUFFIXES:
        raise DataError(f"{path}: expected a .jsonl or .txt file, or a folder of them")
    return [path]


def _read_text(path: Path) -> str:
    try:  # -sig: a byte-order mark (as some editors write) is no part of the text
        return path.read_text(encoding="utf-8-sig")
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
        if suffix(path) == ".txt":
            if not text or text.isspace():  # no text, as a .jsonl of no lines: not a document of one eos
                continue
            pieces = list(_txt_pieces(text))
            yield from ((piece, i == len(pieces) - 1) for i, piece in enumerate(pieces))
        else:
            yield from ((doc, True) for doc in _jsonl_documents(path, text))


def cache_key(files: list[Path], tokenizer_file: Path, eos: int) -> str:
    """sha256 over the files (name and bytes, in order), the tokenizer and the eos id; the tag's
    version changes with the rules that make a stream of them (2: no document of an empty
    .txt, no byte-order mark)."""
    digest = hashlib.sha256(f"hexiscale.tokens/2 eos={eos}\n".encode())
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

    @classmethod
    def of_file(cls, path: Path) -> TokenStream:
        """A stream file already written (a cached one): its length from its size."""
        return cls(path, path.stat().st_size // np.dtype(TOKEN_DTYPE).itemsize)

    def check_length(self, seq_len: int, option: str) -> None:
        """§12's offsets need len − s − 1 ≥ 1: at least one sequence and one more token."""
        if self.tokens < seq_len + 2:
            raise DataError(f"{option}: the corpus has {self.tokens} tokens, fewer than one sequence of "
                            f"{seq_len} + 2 (an input and its next-token targets)")


def check_token_ids(tokenizer, file: Path, vocab: int) -> None:
    """Every id the tokenizer can emit (its vocabulary's and its added tokens') is below V. The
    count alone does not say so: ids may leave gaps, and an id ≥ V has no embedding row (one
    rank's index error under TP 1, a silently zero row of a TP shard's lookup otherwise)."""
    ids = tokenizer.get_vocab(with_added_tokens=True)
    if ids:
        token, top = max(ids.items(), key=lambda item: item[1])
        if top >= vocab:
            raise DataError(f"{file}: token {token!r} has id {top}, outside the model's vocab_size {vocab} "
                            f"(ids 0 to {vocab - 1})")


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
    check_token_ids(tokenizer, file, vocab)
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
    files = corpus_files(path, log)
    tokenizer, tokenizer_file, eos = load_tokenizer(Path(model_folder), vocab)
    folder = cache_folder()
    stream = folder / f"{cache_key(files, tokenizer_file, eos)}.bin"
    if stream.is_file():
        cached = TokenStream.of_file(stream)
        log(f"tokens of {path}: {cached.tokens:,} (cached in {stream})")
        return cached
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
