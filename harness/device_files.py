"""The files of a GPU queue call (tools/gpu_queue.py, docs/gpu-queue.md): what one device call may bring back
(OUT_FILES files of at most recipe.PACK_LIMIT each: brought_back), the outputs kept on the machine between the calls
of an item so that its last call brings them all back (keep_outputs), and how a window's files are unpacked where they
belong (unpack: the call's status.json as <item>.status.json, each row's pack, recipe.pack_run's <run>.tar.gz, as a
run folder, every other file beside them). The rules on the names in them (plain_name, extract_pack) keep anything
from a device call from writing outside the folder it is unpacked into; a refusal is one line (UnpackError) and
leaves nothing.

    python tools/gpu_queue.py unpack <files_at> --into docs/results/2026-11-27-h100
"""
import contextlib
import json
import os
import shutil

from harness.fileio import MARK, check_output, copy_atomic, temporary_folder
from harness.recipe import PACK_LIMIT

OUT_FILES = 8          # what one device call may bring back: at most 8 files, each at most PACK_LIMIT (16 MiB)
NAME_CHARS = frozenset('abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-')   # plain_name's


class UnpackError(ValueError):
    """One line for the user: what a call's files hold that cannot be unpacked, and what to do; nothing was written."""


def brought_back(out):
    """The files under a call's --out, sorted, and a warning when they are more than a device call brings back
    (OUT_FILES) or one is over PACK_LIMIT; None when they fit."""
    files = os.listdir(out)
    big = [f for f in files if os.path.getsize(os.path.join(out, f)) > PACK_LIMIT]
    warning = f"{len(files)} files under --out (at most {OUT_FILES}), over 16 MiB: {big}"
    return sorted(files), (warning if len(files) > OUT_FILES or big else None)


def keep_outputs(out, state_dir, names):
    """What an earlier call of an item wrote to its --out (`out`) is copied into the machine's state folder
    (`state_dir`), and back to this call's --out, so that the last call brings back every output of the item."""
    for name in names:
        here, kept = os.path.join(out, name), os.path.join(state_dir, name)
        if os.path.isfile(here):
            copy_atomic(here, kept)
        elif os.path.isfile(kept):
            copy_atomic(kept, here)


def unpack(src, into, runs_here, program):
    """src/status.json -> INTO/<item>.status.json; every <run>.tar.gz -> INTO/runs/<run>/ and runs_here/<run>/ (for
    reproduce.py --render --goal); every other file -> INTO/. Nothing already there is overwritten. Everything is
    unpacked into temporary folders beside those places first (fileio.temporary_folder, marked as `program`'s) and
    moved in only when every file and pack came out whole: a damaged status.json or pack (cut short, not a tar), a
    name from them that could write outside INTO (an "item" or member with '/' or '..', a link), or two files that
    would land on one name (status.json beside <item>.status.json; a file named runs, the packs' folder) is one line
    (UnpackError) and leaves nothing. A file named .written-by (fileio.MARK) is left out, in a line that says so.
    Returns (the files unpacked, the packs unpacked, [(file, why) for each file left out])."""
    status_path = os.path.join(src, 'status.json')
    if not os.path.isfile(status_path):
        raise UnpackError(f"{src} holds no status.json: give the folder a device call's files came back to")
    try:
        with open(status_path) as f:
            status = json.load(f)
        if not isinstance(status, dict):
            raise ValueError('not a JSON object')
    except (OSError, ValueError) as e:   # a file cut short on the way back
        raise UnpackError(f"{status_path} cannot be read ({e}): the call's files came back damaged; nothing was "
                          f"unpacked: bring them back again") from None
    try:
        check_output(into, '--into', folder=True)
    except ValueError as e:
        raise UnpackError(str(e)) from None
    item = status.get('item', 'item')
    if not plain_name(item):   # the name of a file written into --into: no folder, no '..', no absolute path
        raise UnpackError(f"{status_path}: \"item\": {json.dumps(item)[:80]} is no queue item's name (letters, digits,"
                          f" _ . -): it could name a file outside {into}; nothing was unpacked")
    targets = {'status.json': f"{item}.status.json"}
    packs = sorted(f for f in os.listdir(src) if f.endswith('.tar.gz'))
    left_out = []   # (file, why): every file is unpacked or named in a line saying why it was not
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if os.path.islink(path) or not os.path.isfile(path) or name in packs and not plain_name(name[:-7]):
            raise UnpackError(f"{path} is not what a device call brings back (a plain file; a pack named after its "
                              f"run): a link, a folder or a pack of no run; nothing was unpacked")
        if name == MARK:   # in --into it would claim the folder as a program's (fileio.mark_folder); no result
            left_out.append((path, f"{MARK} is the mark this project's programs leave in a folder they write "
                                   f"(harness/fileio.py MARK); in --into it would claim the folder as theirs"))
        elif name == 'runs':
            raise UnpackError(f"{path} would be unpacked as {os.path.join(into, 'runs')}, the folder the packs unpack "
                              f"into; nothing was unpacked: copy the files without it and unpack the copy")
        elif name not in targets and name not in packs:
            targets[name] = name
    for name, target in targets.items():   # two files to one name: one would replace the other
        twin = next((other for other, t in targets.items() if t == target and other != name), None)
        if twin is not None:
            raise UnpackError(f"{os.path.join(src, name)} and {os.path.join(src, twin)} would both be unpacked as "
                              f"{os.path.join(into, target)}; nothing was unpacked: copy the files without "
                              f"{twin} and unpack the copy")
    runs = [p[:-len('.tar.gz')] for p in packs]
    clash = [os.path.join(into, t) for t in targets.values() if os.path.lexists(os.path.join(into, t))]
    clash += [os.path.join(into, 'runs', r) for r in runs if os.path.lexists(os.path.join(into, 'runs', r))]
    if clash:
        raise UnpackError(f"{clash[0]} exists: unpack into another --into folder (nothing was written)")
    again = [os.path.join(runs_here, r) for r in runs if os.path.lexists(os.path.join(runs_here, r))]
    if again:   # the same row from an earlier window (a row the queue trains again): its own folder under --into stays
        raise UnpackError(f"{again[0]} exists, a run of that name unpacked before: move it aside (its window's copy "
                          f"stays in that window's results folder), then unpack again (nothing was written)")
    stages, made, done = {}, [], False
    try:
        for final in (into, runs_here):
            parent = os.path.dirname(final)
            while not os.path.exists(parent):   # the folders made here, removed again if nothing is unpacked
                made.append(parent)
                parent = os.path.dirname(parent)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            stages[final] = temporary_folder(final, program)
        for name, target in targets.items():
            shutil.copy(os.path.join(src, name), os.path.join(stages[into], target))
        for pack, run in zip(packs, runs):
            for dest in (os.path.join(stages[into], 'runs'), stages[runs_here]):
                extract_pack(os.path.join(src, pack), run, dest)
        for final, stage in stages.items():   # every pack whole: now into their places
            for entry in [e for e in os.listdir(stage) if e != MARK]:
                parts = [os.path.join(entry, r) for r in os.listdir(os.path.join(stage, entry))] if entry == 'runs' \
                    else [entry]
                for part in parts:
                    os.makedirs(os.path.dirname(os.path.join(final, part)), exist_ok=True)
                    os.replace(os.path.join(stage, part), os.path.join(final, part))
        done = True
    except OSError as e:
        raise UnpackError(f"cannot unpack into {into} ({e.strerror}: {e.filename}): choose another --into") from None
    finally:
        for stage in stages.values():
            shutil.rmtree(stage, ignore_errors=True)
        for folder in [] if done else sorted(made, key=len, reverse=True):
            with contextlib.suppress(OSError):   # only while empty
                os.rmdir(folder)
    for path, why in left_out:
        print(f"left out {path}: {why}")
    return list(targets), packs, left_out


def plain_name(name):
    """A name unpack may write under: one path component of letters, digits, _ . - that is not '.' or '..'."""
    return isinstance(name, str) and name.strip('.') != '' and set(name) <= NAME_CHARS


def extract_pack(path, run, dest):
    """One row's pack (recipe.pack_run: members <run>/<file>) into dest/<run>/, read to its end: a pack cut short,
    a file that is no gzipped tar, a member outside <run>/ (an absolute name, a '..' component), a member that is no
    plain file or folder (a link, a device) or one tarfile's 'data' filter refuses is a one-line UnpackError."""
    import tarfile
    import zlib
    try:
        with tarfile.open(path, 'r:gz') as tar:
            members = tar.getmembers()   # reads the whole pack: a truncated one fails here
            outside = [m.name for m in members if not m.name.startswith(run + '/') or not (m.isfile() or m.isdir())
                       or not all(plain_name(part) for part in m.name[len(run) + 1:].split('/'))]
            if outside:
                raise UnpackError(f"{path}: the member {outside[0]} lies outside {run}/ or is no file (a link, a "
                                  f"device; not a pack of this queue); nothing was unpacked")
            tar.extractall(dest, members=members, filter='data')
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise UnpackError(f"{path} is damaged or not a pack ({type(e).__name__}: {e}); nothing was unpacked: bring the "
                          f"call's files back again") from None
