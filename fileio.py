"""Small file helpers every script shares: atomic JSON writes, tolerant JSON reads, a progress line, durations,
the one-line message of a full disk, PrepareError (a problem with the user's files or arguments that the
scripts print as one line), the one check of an output path before any work (check_output), the one rule of what a
program may remove or replace (temporary, mark_folder, remove_temporaries: only what it wrote, marked as such), and
the check of a command-line number (number: finite, in range)."""
import argparse
import errno
import fnmatch
import hashlib
import json
import math
import os
import shutil
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
    tmp = Path(temporary(path))
    try:
        tmp.write_text(json.dumps(obj, indent=indent) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)   # a full disk leaves neither a half file nor a leftover
        raise


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
    """Whether a failed write failed because the disk (or the user's quota) is full: OSError ENOSPC / EDQUOT, the
    RuntimeError torch.save raises when its writer cannot write ('unexpected pos ...', 'No space left'), or another
    library's error that says so (safetensors' SafetensorError: '... No space left on device (os error 28)')."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    text = str(e)
    return 'No space left' in text or isinstance(e, RuntimeError) and ('unexpected pos' in text
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


# ----------------------------------------------------------------------------- what a program wrote
# The one rule for cleaning up and replacing: a program removes or replaces only what it wrote itself, marked as such.
# A file being written is NAME.tmp beside NAME (temporary), renamed to NAME when complete; a folder a program writes
# (a sharded checkpoint, an export) holds the file MARK, which names the program (mark_folder). A leftover NAME.tmp of a
# killed write is removed by the program that writes NAME (remove_temporaries): a file under one of that program's
# own names, a folder only when it carries the program's mark (or is empty). A folder is replaced as a whole (e.g.
# export_hf.py --force) only when it carries the mark of the program replacing it (check_output(replace=...)).
MARK = ".written-by"


def temporary(path) -> str:
    """The name of `path` while it is being written: PATH.tmp, beside it (a rename makes it PATH)."""
    return f"{path}.tmp"


def mark_folder(folder, program):
    """Create folder (parents included) and mark it as written by `program` (e.g. 'export_hf.py')."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, MARK), "w") as f:
        f.write(program + "\n")


def written_by(folder):
    """The program whose mark the folder carries, or None."""
    try:
        return Path(folder, MARK).read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def ours(path, program) -> bool:
    """Whether `program` may remove or replace the folder `path`: a real folder (not a link) that carries its mark or
    is empty."""
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    return written_by(path) == program or not os.listdir(path)


def remove_temporaries(folder, names, program):
    """Remove the leftovers of `program`'s killed writes in folder: NAME.tmp for every NAME that matches one of
    `names` (fnmatch patterns of what the program writes there): a file, or a folder that is ours(). Anything else is
    left as it is (a user's plots.tmp, a folder of another program). Returns the paths removed, in order."""
    removed = []
    for entry in sorted(os.listdir(folder)):
        if not entry.endswith(".tmp") or not any(fnmatch.fnmatchcase(entry[:-4], n) for n in names):
            continue
        path = os.path.join(folder, entry)
        if os.path.isfile(path) and not os.path.islink(path):
            os.remove(path)
        elif ours(path, program):
            shutil.rmtree(path)
        else:
            continue
        removed.append(path)
    return removed


def _inside(path, folder) -> bool:
    """Whether path is folder or lies inside it (both made absolute, links resolved)."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _unwritable(folder):
    """Why this process cannot create files in folder (a read-only filesystem, no permission), or None."""
    if os.access(folder, os.W_OK | os.X_OK):
        return None
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "a read-only filesystem"
    except (OSError, AttributeError):   # AttributeError: no statvfs (Windows)
        pass
    return "no write permission for this user"


def check_output(path, option, folder=False, inputs=(), replace=None, make=False):
    """The one check of an output path, before any work: `path` (a file, or with folder=True a folder) can be
    written as the output of command-line option `option`, else a one-line ValueError saying what is wrong and how
    to choose: the path lies under a file; it exists as the other kind (a folder where a file is written, a file
    where a folder is); it is one of `inputs` (or, when it is replaced as a whole, holds one); it, or the folder it
    would be made in, cannot be written (a read-only filesystem, no permission). replace=PROGRAM: the folder is
    replaced as a whole, so an existing one must be ours() (empty or carrying PROGRAM's mark): nothing of a user's
    is replaced. make=True creates the folder (folder=True) or the folder the file goes into, parents included.
    Returns path."""
    absolute = os.path.abspath(path)
    existing = absolute
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if existing != absolute and not os.path.isdir(existing):
        raise ValueError(f"{option} {path}: {existing} is a file, not a folder; choose another {option}")
    if os.path.exists(absolute) and folder and not os.path.isdir(absolute):
        raise ValueError(f"{option} {path} is a file, not a folder; choose another {option}")
    if os.path.isdir(absolute) and not folder:
        raise ValueError(f"{option} {path} is a folder, not a file; give a file's path, e.g. "
                         f"{os.path.join(path, 'out.json')}")
    for given in inputs:
        if not given or not os.path.exists(given):
            continue
        if _inside(given, absolute) if replace is not None else os.path.isfile(given) and _inside(absolute, given):
            raise ValueError(f"{option} {path} {'holds' if replace else 'is'} the input {given}: writing it would "
                             f"replace what is read; choose another {option}")
    if replace is not None and os.path.lexists(absolute) and not ours(absolute, replace):
        raise ValueError(f"{option} {path} exists and was not written by {replace} (no {MARK} file naming it): only "
                         f"an empty folder or an earlier output of {replace} is replaced; choose another {option}, or "
                         f"move it away first")
    if existing != absolute:               # made in the nearest folder that exists
        target = existing
    else:                                  # written into the folder, or beside the file / the replaced folder
        target = absolute if os.path.isdir(absolute) and replace is None else os.path.dirname(absolute)
    why = _unwritable(target) or (None if not os.path.isfile(absolute) or os.access(absolute, os.W_OK)
                                  else "the file is read-only")
    if why:
        raise ValueError(f"{option} {path}: cannot write to {target} ({why}); choose another {option}")
    if make:
        try:
            os.makedirs(absolute if folder else os.path.dirname(absolute), exist_ok=True)
        except OSError as e:
            raise ValueError(f"{option} {path}: cannot create the folder ({e.strerror}: {e.filename}); "
                             f"choose another {option}") from None
    return path


# ----------------------------------------------------------------------------- command-line numbers
def number(kind=float, low=None, high=None, low_open=False, what=""):
    """An argparse `type`: a finite number of `kind` (int or float) in [low, high] ((low, high] with low_open);
    anything else (nan, inf, a word, out of range) is argparse's one-line error naming the option."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        below = low is not None and (value <= low if low_open else value < low)
        if not math.isfinite(value) or below or (high is not None and value > high):
            bounds = ([f"{'>' if low_open else '>='} {low:g}"] if low is not None else []) + (
                [f"<= {high:g}"] if high is not None else [])
            raise argparse.ArgumentTypeError(f"{text} is not allowed: a finite {'integer' if kind is int else 'number'}"
                                             f"{' ' + ' and '.join(bounds) if bounds else ''}{what}")
        return value
    parse.__name__ = kind.__name__   # argparse names the type in its messages
    return parse
