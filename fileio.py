"""Small file helpers every script shares: atomic JSON writes, tolerant JSON reads, a progress line, durations,
the one-line message of a full disk, and PrepareError (a problem with the user's files or arguments that the
scripts print as one line)."""
import errno
import hashlib
import json
import os
import sys
import time
from pathlib import Path


class PrepareError(Exception):
    """A problem the user can fix; the CLI prints it as one line `error: ...` and exits 2."""


def duration(seconds: float) -> str:
    s = int(max(seconds, 0))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{max(seconds, 0):.1f}s"


class Progress:
    """A status line on stderr every ~2 s: documents, tokens, tokens/s and an ETA."""

    def __init__(self, label, target_tokens=None, target_docs=None, unit="docs"):
        self.label, self.target_tokens, self.target_docs, self.unit = label, target_tokens, target_docs, unit
        self.t0 = self.last = time.time()
        self.docs = self.tokens = 0

    def update(self, docs, tokens):
        self.docs, self.tokens = docs, tokens
        if time.time() - self.last >= 2.0:
            self.last = time.time()
            print(f"{self.label}: {self.line()}", file=sys.stderr, flush=True)

    def line(self, eta=True):
        dt = max(time.time() - self.t0, 1e-9)
        text = f"{self.docs:,}" + (f"/{self.target_docs:,}" if self.target_docs else "") + f" {self.unit}"
        if self.tokens:
            text += f", {self.tokens:,} tokens, {self.tokens / dt:,.0f} tokens/s"
        else:
            text += f", {self.docs / dt:,.1f} {self.unit}/s"
        text += f", {duration(dt)}"
        if eta and self.target_tokens and self.tokens:
            text += f", ETA {duration((self.target_tokens - self.tokens) * dt / self.tokens)}"
        elif eta and self.target_docs and self.docs:
            text += f", ETA {duration((self.target_docs - self.docs) * dt / self.docs)}"
        return text

    def done(self, extra=""):
        print(f"{self.label}: done, {self.line(eta=False)}" + (f"; {extra}" if extra else ""), file=sys.stderr, flush=True)


def write_json(path, obj, indent=2):
    """Write obj as JSON atomically: a temporary file beside path, then a rename."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=indent) + "\n")
    os.replace(tmp, path)


def portable_path(path):
    """A path as an output file records it: relative to the working directory, never absolute (a result file
    names no user's folder and stays true when the repository moves with its data)."""
    return os.path.relpath(path) if path and os.path.isabs(path) else path


def model_label(name):
    """How an output file names a model: a local checkpoint, folder or GGUF file by portable_path, a hub name as
    given (a GGUF file found by absolute path was recorded with it before 2026-11-26)."""
    return portable_path(name) if name and os.path.exists(name) else name


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in chunks (a progress line every ~2 s on big files)."""
    path = Path(path)
    sha, size, chunk = hashlib.sha256(), path.stat().st_size, 1 << 26
    progress = Progress(f"checking sha256 of {path}", target_docs=(size + chunk - 1) // chunk, unit="chunks")
    with open(path, "rb") as f:
        while block := f.read(chunk):
            sha.update(block)
            progress.update(progress.docs + 1, 0)
    return sha.hexdigest()


def disk_full(e: BaseException) -> bool:
    """Whether a failed write failed because the disk (or the user's quota) is full: OSError ENOSPC / EDQUOT, or
    the RuntimeError torch.save raises when its writer cannot write ('unexpected pos ...', 'No space left')."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    text = str(e)
    return isinstance(e, RuntimeError) and ('unexpected pos' in text or 'No space left' in text
                                            or 'file write failed' in text)


def disk_full_text(path) -> str:
    """The one line a script prints when a write into path found the disk full."""
    folder = os.path.dirname(os.path.abspath(path))
    return f"the disk holding {folder} is full (writing {path} failed); free some space, then run the same command again"


REPO = Path(__file__).resolve().parent


def corpus_cache() -> Path:
    """The pinned corpus's artifact folder (GPT-2's ranks among them): $CORPUS_CACHE, else data/corpus_cache in the
    working directory when there is one, else the repository's data/corpus_cache, so that a script run from
    another folder finds what `python corpus.py fetch` put in the repository."""
    if os.environ.get("CORPUS_CACHE"):
        return Path(os.environ["CORPUS_CACHE"])
    here = Path("data", "corpus_cache")
    return here if here.is_dir() else REPO / "data" / "corpus_cache"


def lock_folder(folder, wait: bool):
    """An exclusive lock on the folder itself (no file is written into it), held until release_lock or the end of
    the process (the kernel frees it however the process ends). wait=False: BlockingIOError when another process
    holds it. Returns the file descriptor, or None where there are no such locks (no fcntl: Windows)."""
    try:
        import fcntl
    except ImportError:
        return None
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except OSError:
        os.close(fd)
        raise BlockingIOError(f"{folder} is locked by another process") from None
    return fd


def release_lock(fd):
    if fd is not None:
        os.close(fd)
