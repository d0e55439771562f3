"""Small file helpers every script shares: atomic JSON writes, tolerant JSON reads, a progress line, durations,
the one-line message of a full disk, PrepareError (a problem with the user's files or arguments that the
scripts print as one line), the one check of an output path before any work (check_output), the one way to write a
file or folder under a temporary name (atomic_write, temporary_folder: a new name, created exclusively, renamed when
complete), the one rule of what a program may remove or replace (mark_folder, remove_temporaries, own_files: only
what it wrote, marked as such), and the checks of a command-line value (number: finite, in range; path_arg: not
empty)."""
import argparse
import contextlib
import errno
import fnmatch
import hashlib
import json
import math
import os
import re
import secrets
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
    """Write obj as JSON atomically (atomic_write: a new temporary file beside path, then a rename)."""
    with atomic_write(path) as f:
        f.write(json.dumps(obj, indent=indent) + "\n")


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


REPO = Path(__file__).resolve().parent.parent   # the repository: this file is harness/fileio.py
MANIFEST = REPO / "pinned_corpus" / "manifest.json"   # the pinned corpus's definition (docs/data.md)


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
# The one rule for writing, cleaning up and replacing: a program removes or replaces only what it wrote itself, marked
# as such. A file is written under a new temporary name beside it, NAME.<8 hex digits>.tmp, created exclusively (an
# existing name, a symbolic link among them, is never opened, followed or replaced), and renamed to NAME when complete
# (atomic_write); a folder likewise (temporary_folder). A folder a program writes (a sharded checkpoint, an export)
# holds the file MARK, which names the program and, once the folder is complete, each file it wrote with its sha256
# (mark_folder). A leftover temporary of a killed write is removed by the program that writes NAME
# (remove_temporaries): a file under one of that program's own names, a folder only when it carries the program's mark
# (or is empty). An earlier output folder is replaced (e.g. export_hf.py --force) only file by file, and only the files
# its mark lists, each as it was written (own_files; check_output(replace=...)): a file added or changed since is not
# the program's.
MARK = ".written-by"
TEMPORARY = re.compile(r"(.+?)(\.[0-9a-f]{8})?\.tmp")   # NAME.tmp (before 2026-11-28) or NAME.<8 hex>.tmp
TEMPORARY_EXTRA = 13                                     # what .<8 hex>.tmp adds to a name


def _temporary_name(path) -> str:
    return f"{path}.{secrets.token_hex(4)}.tmp"


@contextlib.contextmanager
def atomic_write(path, mode="w", sync=False, **kwargs):
    """Write `path` atomically: yields a file opened (open's `mode`, 'w' or 'wb', and kwargs) under a new temporary
    name beside it, created exclusively (mode 'x': an existing name, a link too, is never followed), renamed to path
    when the block ends; sync=True fsyncs it first. An exception inside the block (a full disk, a failed check, an
    interrupt) removes the temporary file and leaves path as it was."""
    for _ in range(100):
        tmp = _temporary_name(path)
        try:
            f = open(tmp, mode.replace("w", "x"), **kwargs)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, "no free temporary name", f"{path}.*.tmp")
    try:
        with f:
            yield f
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if isinstance(e, OSError) and e.filename is None:   # a write's error names no file: the one line names path
            e.filename = os.fspath(path)
        raise


def torch_load(path, **kwargs):
    """torch.load of a file torch.save writes (a zip archive). Anything else raises ValueError before the unpickler
    sees it: random bytes unpickled can make CPython print a stray line (a SystemError about a bytearray's exported
    buffers) to stderr beside the one-line error a caller prints."""
    import zipfile
    if not zipfile.is_zipfile(path):
        raise ValueError("not a file torch.save writes (a zip archive): truncated, or other bytes")
    import torch
    return torch.load(path, **kwargs)


def copy_atomic(src, dst):
    """Copy the file src to dst (a file's path, or a folder: dst/<src's name>) through atomic_write: a full disk or a
    kill leaves dst as it was, never a cut copy. Returns the path written."""
    if os.path.isdir(dst):
        dst = os.path.join(dst, os.path.basename(src))
    with open(src, "rb") as f, atomic_write(dst, "wb") as out:
        shutil.copyfileobj(f, out)
    return dst


def temporary_folder(path, program) -> str:
    """A new folder beside `path` (PATH.<8 hex>.tmp), created exclusively (os.mkdir: an existing name is never
    followed) and marked as `program`'s at once, so that a killed write leaves a folder only `program` removes.
    Returns its path; the caller renames it to path when complete."""
    for _ in range(100):
        tmp = _temporary_name(path)
        try:
            os.mkdir(tmp)
        except FileExistsError:
            continue
        mark_folder(tmp, program)
        return tmp
    raise FileExistsError(errno.EEXIST, "no free temporary name", f"{path}.*.tmp")


def mark_folder(folder, program, files=False):
    """Mark the existing `folder` as written by `program` (e.g. 'export_hf.py'): MARK's first line names it; with
    files=True each further line is '<sha256>  <name>' for a file in the folder (all of them, the mark excepted), the
    files `program` may later replace (own_files)."""
    lines = [program]
    if files:
        for root, _, names in sorted(os.walk(folder)):
            for name in sorted(names):
                rel = os.path.relpath(os.path.join(root, name), folder)
                if rel != MARK:
                    lines.append(f"{file_sha256(os.path.join(root, name))}  {rel}")
    with atomic_write(os.path.join(folder, MARK)) as f:
        f.write("\n".join(lines) + "\n")


def written_by(folder):
    """The program whose mark the folder carries, or None."""
    try:
        return Path(folder, MARK).read_text().split("\n", 1)[0].strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def ours(path, program) -> bool:
    """Whether `program` may remove the folder `path` as a whole (a temporary folder of its own, a sharded
    checkpoint): a real folder (not a link) that carries its mark or is empty."""
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    return written_by(path) == program or not os.listdir(path)


def own_files(folder, program):
    """What `program` may replace in its earlier output `folder`: {name: sha256} of the files its mark lists, each
    unchanged since (a name the mark lists twice, a replacement under way, may hold either); {} for an empty folder
    or one that holds the mark alone.
    A one-line ValueError when the folder is not `program`'s, or when a file it listed was changed since (another
    program wrote into it): then nothing in it is."""
    if os.path.islink(folder) or not os.path.isdir(folder):
        raise ValueError(f"is {'a link' if os.path.islink(folder) else 'a file'}, not a folder {program} wrote")
    if not os.listdir(folder):
        return {}
    try:
        lines = Path(folder, MARK).read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        lines = []
    if not lines or lines[0].strip() != program:
        raise ValueError(f"was not written by {program} (no {MARK} file naming it)")
    listed = {}
    for line in lines[1:]:
        sha, _, name = line.partition("  ")
        listed.setdefault(name, set()).add(sha)
    if not listed and os.listdir(folder) != [MARK]:
        raise ValueError(f"was written by {program} before its {MARK} listed the files it wrote (2026-11-28)")
    own = {}
    for name, shas in listed.items():
        path = os.path.join(folder, name)
        if not os.path.lexists(path):
            continue
        sha = file_sha256(path) if os.path.isfile(path) and not os.path.islink(path) else None
        if sha not in shas:
            raise ValueError(f"holds {name}, changed since {program} wrote it (another program wrote into the folder)")
        own[name] = sha
    return own


def remove_temporaries(folder, names, program):
    """Remove the leftovers of `program`'s killed writes in folder: NAME.<8 hex>.tmp (or NAME.tmp) for every NAME
    that matches one of `names` (fnmatch patterns of what the program writes there): a file, or a folder that is
    ours(). Anything else is left as it is (a user's plots.tmp, a folder of another program, a link). Returns the
    paths removed, in order."""
    removed = []
    for entry in sorted(os.listdir(folder)):
        match = TEMPORARY.fullmatch(entry)
        if not match or not any(fnmatch.fnmatchcase(match.group(1), n) for n in names):
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


def _name_too_long(absolute, existing, folder, replace):
    """Why a name on the way to `absolute` (below `existing`, the nearest folder that exists) is longer than the
    filesystem allows, counting the temporary name a file is written under (atomic_write), or None."""
    try:
        name_max, path_max = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):   # AttributeError: no pathconf (Windows)
        name_max, path_max = 255, 4096
    extra = TEMPORARY_EXTRA if not folder or replace is not None else 0
    names = os.path.relpath(absolute, existing).split(os.sep) if existing != absolute else []
    names = names or [os.path.basename(absolute)]
    for i, name in enumerate(names):
        size = len(os.fsencode(name)) + (extra if i == len(names) - 1 else 0)
        if size > name_max:
            return f"the name {name[:24]}... is {len(os.fsencode(name))} bytes, longer than this filesystem allows " \
                   f"({name_max}{f' less {extra} for the temporary name it is written under' if extra else ''})"
    if len(os.fsencode(absolute)) + extra >= path_max:
        return f"the path is {len(os.fsencode(absolute))} bytes, longer than this filesystem allows ({path_max})"
    return None


def check_output(path, option, folder=False, inputs=(), replace=None, make=False):
    """The one check of an output path, before any work: `path` (a file, or with folder=True a folder) can be
    written as the output of command-line option `option`, else a one-line ValueError saying what is wrong and how
    to choose: the path is empty (an unset shell variable), or a name on it is longer than the filesystem allows; it
    lies under a file; it exists as the other kind (a folder where a file is written, a file where a folder is); it
    is one of `inputs` (files and folders the command reads; compared with links and '..' resolved): an input file, an
    existing file inside an input folder, or, for a folder replaced, a folder holding an input; it, or the folder it
    would be made in, cannot be written (a read-only filesystem, no permission). replace=PROGRAM: an existing folder
    is an earlier output of PROGRAM whose files may be replaced (own_files: empty, or carrying PROGRAM's mark, its
    files unchanged): nothing of a user's is replaced. make=True creates the folder (folder=True) or the folder the
    file goes into, parents included. Returns path."""
    if not path or not path.strip():     # '' or '  ': an unset shell variable, never a folder meant
        raise ValueError(f"{option} is an empty path (an unset shell variable?); give a "
                         f"{'folder' if folder else 'file'}")
    shown = path if len(path) <= 400 else f"{path[:300]}...{path[-60:]}"   # only an absurd path is cut
    absolute = os.path.abspath(path)
    existing = absolute
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if existing != absolute and not os.path.isdir(existing):
        raise ValueError(f"{option} {shown}: {existing} is a file, not a folder; choose another {option}")
    too_long = _name_too_long(absolute, existing, folder, replace)
    if too_long:
        raise ValueError(f"{option} {shown}: {too_long}; choose a shorter {option}")
    if os.path.exists(absolute) and folder and not os.path.isdir(absolute):
        raise ValueError(f"{option} {shown} is a file, not a folder; choose another {option}")
    if os.path.isdir(absolute) and not folder:
        raise ValueError(f"{option} {shown} is a folder, not a file; give the path of a file, e.g. "
                         f"{os.path.join(path, 'out.json')}")
    for given in inputs:
        if not given or not os.path.exists(given):
            continue
        if replace is not None:
            clash = _inside(given, absolute) and 'holds the input'
        elif os.path.isfile(given):
            clash = _inside(absolute, given) and 'is the input'
        else:                              # an existing file inside an input folder (a model's folder, ...)
            clash = not folder and os.path.isfile(absolute) and _inside(absolute, given) and 'is a file of the input'
        if clash:
            raise ValueError(f"{option} {shown} {clash} {portable_path(given)}: writing it would replace what is "
                             f"read; choose another {option}")
    if replace is not None and os.path.lexists(absolute):
        try:
            own_files(absolute, replace)
        except ValueError as e:
            raise ValueError(f"{option} {shown} exists and {e}: only an empty folder or an earlier output of "
                             f"{replace} is replaced; choose another {option}, or move it away first") from None
    if existing != absolute:               # made in the nearest folder that exists
        target = existing
    else:                                  # written into the folder, or beside the file / the replaced folder
        target = absolute if os.path.isdir(absolute) and replace is None else os.path.dirname(absolute)
    why = _unwritable(target) or (None if not os.path.isfile(absolute) or os.access(absolute, os.W_OK)
                                  else "the file is read-only")
    if why:
        raise ValueError(f"{option} {shown}: cannot write to {target} ({why}); choose another {option}")
    if make:
        try:
            os.makedirs(absolute if folder else os.path.dirname(absolute), exist_ok=True)
        except OSError as e:
            raise ValueError(f"{option} {shown}: cannot create the folder ({e.strerror}: {e.filename}); "
                             f"choose another {option}") from None
    return path


# ----------------------------------------------------------------------------- command-line values
def number(kind=float, low=None, high=None, low_open=False, what=""):
    """An argparse `type`: a finite number of `kind` (int or float) in [low, high] ((low, high] with low_open); an
    integer may be written 100000, 100_000 or 1e5; anything else (nan, inf, 1e400, 2.5 for an integer, a word, out
    of range) is argparse's one-line error naming the option."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = _whole(text) if kind is int else None
            if value is None:
                raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") \
                    from None
        below = low is not None and (value <= low if low_open else value < low)
        if not math.isfinite(value) or below or (high is not None and value > high):
            bounds = ([f"{'>' if low_open else '>='} {low:g}"] if low is not None else []) + (
                [f"<= {high:g}"] if high is not None else [])
            raise argparse.ArgumentTypeError(f"{text} is not allowed: a finite {'integer' if kind is int else 'number'}"
                                             f"{' ' + ' and '.join(bounds) if bounds else ''}{what}")
        return value
    parse.__name__ = kind.__name__   # argparse names the type in its messages
    return parse


integer = number(int)   # argparse type of every script's integer options: 100000, 100_000 or 1e5 alike


def _whole(text):
    """An integer written as a float (1e5, 2.0e3); an infinity or NaN as it is (1e400: number refuses it as not
    finite); None for anything else (2.5, a word)."""
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value):
        return value
    return int(value) if value == int(value) else None


def comma_list(text):
    """The items of a comma-separated option, in order, each stripped, empty ones and repeats dropped:
    ' a, b,,a' -> ('a', 'b'). The options that name things to run (--schemes, --interventions, --parts) read
    their lists this way, so a space after a comma or a name given twice changes nothing."""
    return tuple(dict.fromkeys(x.strip() for x in text.split(',') if x.strip()))


def path_arg(text):
    """An argparse `type` for a path option: an empty one (an unset shell variable: --out_dir "$UNSET") is
    argparse's one-line error naming the option, not the default."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path is not allowed (an unset shell variable?); give a path")
    return text


def path_arg_path(text):
    """path_arg as a pathlib.Path, for options read as paths."""
    return Path(path_arg(text))
