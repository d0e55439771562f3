"""How every script ends: the one entry point each script's `if __name__ == '__main__':` goes through
(run_script), and the one way a script starts a child process (start_child), so that a new script gets both for free
(docs/guarantees.md, "How a script ends"):

    if __name__ == '__main__':
        run_script(main)             # main(*args) returns an exit code or None, or raises SystemExit

A script's first statements are `from harness.entry import early_exit_on_signal` and
`early_exit_on_signal(__name__)`, before it imports torch (an import of the script, by a test or a tool, changes no
handler): from then until run_script takes over, SIGINT and SIGTERM end it at once with the same line
and exit code (there is nothing to clean up yet), where Python would print KeyboardInterrupt's traceback (or SIGTERM
kill it with no line). After run_script has ended, a late signal (torchrun's SIGTERM to a rank that is already
exiting) is ignored.

run_script(main) turns
- SIGINT (Ctrl-C) and SIGTERM (a scheduler's, `kill PID`'s) into one line on stderr, `analyze.py: stopped by SIGTERM`,
  and exit 128 + the signal's number (130, 143), as a shell reports a process a signal ended. A SIGTERM is raised
  where the program is, as Ctrl-C's KeyboardInterrupt is (Stopped is a subclass of it), so every cleanup written for
  Ctrl-C (a temporary file removed, a worker pool closed) runs for both. train.py's training loop takes both signals
  itself (its checkpoint) and returns 128 + the number;
- a full disk (fileio.disk_full: OSError ENOSPC / EDQUOT, torch.save's error) into one line, `analyze.py: error: the
  disk holding ... is full (writing ... failed); ...`, and exit 1.

Once the script has begun to end (main returned or raised, or it called ending() after printing its error line and
before its teardown), a signal is passed on to the children but never raised: it would land in a finalizer of the
teardown as an `Exception ignored in ...` traceback.

No child that start_child() started outlives the script. A child runs in a session of its own, so a signal reaches it
once, from its parent: the terminal's Ctrl-C reaches the script alone, and a SIGTERM sent to the script's pid alone
(a scheduler's, `kill`) reaches the child too. The script passes the signal on at once to each child's process group
(with the child's own children: torchrun's ranks, a pool's workers), waits up to GRACE_S for them (train.py finishes
its step and writes its checkpoint), then kills what is left (SIGKILL: the child's group and every process below
it, found before it dies, since a child killed before it passed the signal on would orphan its own children).
However main ends, a child still running is stopped the same way (SIGTERM, then SIGKILL). Once a signal has
arrived, start_child() starts nothing: it raises the signal's exception in the thread that called it (reproduce.py's
rows run in threads).

torchrun is not one of these scripts: a signal to it ends its ranks (each a train.py: its checkpoint, exit 128 + N),
and it exits 1 (docs/training.md, "Stopping").
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

from harness.fileio import disk_full, disk_full_text

GRACE_S = 60          # how long a child a signal stopped may take to end: train.py's step and checkpoint
SIGNALS = (signal.SIGINT, signal.SIGTERM)
_children = []        # every process start_child() started that may still run
_lock = threading.RLock()   # start_child() in a worker thread against the signal handler in the main thread
_state = {'owner': None, 'signal': None, 'ending': False, 'signalled': set(), 'ended': False, 'early': None}


class Stopped(KeyboardInterrupt):
    """A SIGTERM, raised where the program is, as SIGINT's KeyboardInterrupt is."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stopping():
    """The signal this script received (a signal.Signals), or None."""
    return _state['signal'] and signal.Signals(_state['signal'])


def start_child(cmd, **kwargs):
    """subprocess.Popen(cmd, **kwargs) in a session (process group) of its own, remembered: run_script() passes a
    signal on to it and its children, and stops it if it still runs when the script ends. Once a signal has arrived
    it starts nothing and raises that signal's exception (KeyboardInterrupt, Stopped)."""
    with _lock:
        if _state['signal']:
            raise _exception(_state['signal'])
        proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)
        _children[:] = [p for p in _children if p.returncode is None] + [proc]
    return proc


def stop_child(proc, signum=signal.SIGTERM, grace=GRACE_S):
    """Send signum to a child start_child() started (its process group: its own children too), wait up to grace
    seconds, then SIGKILL what is left of the group. Returns the child's exit code."""
    _signal_group(proc, signum)
    try:
        return proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return proc.wait()


def early_exit_on_signal(module_name):
    """Call first in a script, `early_exit_on_signal(__name__)`, before its heavy imports: when the module runs as
    the script (__main__), until run_script installs its handler SIGINT and SIGTERM print `NAME: stopped by SIGINT`
    and end the process at once with 128 + N; after run_script has ended they are ignored (the script is exiting with
    its own code). An import of the module (a test's `import train`) changes nothing: the importing process keeps its
    own handlers, and the processes it forks (a multiprocessing pool, whose terminate() is a SIGTERM) theirs. A signal
    ignored at launch (nohup, a background job) stays ignored."""
    if module_name != '__main__':
        return
    _state.update(ended=False, early=os.getpid())
    for s in SIGNALS:
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, _early_signal)


def _early_signal(signum, _frame):
    if os.getpid() != _state['early']:   # a forked child (a pool's worker) that kept the handler: Python's default
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if _state['ended']:
        return
    _say(f"{os.path.basename(sys.argv[0]) or 'python'}: stopped by {signal.Signals(signum).name}")
    os._exit(128 + signum)


def ending():
    """The script has begun to end (its error line is printed; its teardown follows): from now on a signal is passed
    on to the children and not raised."""
    _state['ending'] = True


def run_script(main, *args, note=None):
    """main(*args) as the script, then exit: with main's return value when it is an exit code (an int or a
    string, as sys.exit takes them; anything else, such as bench.py's results: None, exit 0), or after a signal with one line and
    128 + its number (`note`, when given, ends the line: what the user can do, e.g. 'the same command continues'),
    or after a full disk with one line and 1. Any other exception is main's own (a SystemExit, a traceback)."""
    name = script_name(main)
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    _state.update(owner=os.getpid(), signal=None, ending=False, signalled=set(), ended=False)
    for s, handler in previous.items():
        if handler is not signal.SIG_IGN:   # ignored at launch (nohup, a script's background job): stays ignored
            signal.signal(s, _on_signal)
    code = None
    try:
        code = main(*args)
        _state['ending'] = True
    except KeyboardInterrupt as e:
        _state['ending'] = True
        signum = getattr(e, 'signum', signal.SIGINT)
        _end_children(signum)
        _say(f"{name}: stopped by {signal.Signals(signum).name}" + (f"; {note}" if note else ''))
        code = 128 + signum
    except Exception as e:
        _state['ending'] = True
        if not disk_full(e):
            raise
        _say(f"{name}: error: {full_disk_text(e)}")
        code = 1
    finally:
        _end_children(signal.SIGTERM)
        _state['ending'] = True
        for s, handler in previous.items():
            signal.signal(s, handler)
        _state.update(owner=None, signal=None, ending=False, signalled=set(), ended=True)
    sys.exit(code if isinstance(code, (int, str)) and not isinstance(code, bool) else None)


def script_name(main):
    """The file name of the script main belongs to (analyze.py, gpu_queue.py), as its error lines begin."""
    path = getattr(sys.modules.get(main.__module__), '__file__', None) or sys.argv[0]
    return os.path.basename(path)


def full_disk_text(e):
    """fileio.disk_full_text of the file a full-disk error names (the file itself, not its temporary name
    NAME.<8 hex>.tmp; a copy's destination), else a line without a path."""
    path = getattr(e, 'filename2', None) or getattr(e, 'filename', None)
    if not path:
        return "a disk this command writes to is full; free some space, then run the same command again"
    return disk_full_text(re.sub(r'\.[0-9a-f]{8}\.tmp$', '', os.fsdecode(path)))


# ----------------------------------------------------------------------------- the signal and the children
def _exception(signum):
    return KeyboardInterrupt() if signum == signal.SIGINT else Stopped(signum)


def _on_signal(signum, _frame):
    """Pass the signal on to every child at once, then raise it here (the first one only: a second Ctrl-C while
    the children end is passed on, never raised inside the cleanup)."""
    if os.getpid() != _state['owner']:   # a forked worker (multiprocessing): the signal's default, as before
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    with _lock:
        first = _state['signal'] is None and not _state['ending']
        _state['signal'] = _state['signal'] or signum
        for proc in list(_children):
            if proc.poll() is None:
                _signal_group(proc, signum)
                _state['signalled'].add(proc.pid)
    if first:
        raise _exception(signum)


def _signal_group(proc, signum):
    try:
        os.killpg(proc.pid, signum)   # start_new_session: the child leads its group
    except (ProcessLookupError, PermissionError):
        pass


def descendants(pid):
    """Every process below pid, from each process's parent in /proc/<pid>/stat (none where there is no /proc)."""
    below = {}
    try:
        names = os.listdir('/proc')
    except OSError:
        return []
    for name in names:
        try:
            with open(f'/proc/{name}/stat') as f:
                below.setdefault(int(f.read().rsplit(')', 1)[1].split()[1]), []).append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    found, todo = [], [pid]
    while todo:
        children = below.get(todo.pop(), [])
        found += children
        todo += children
    return found


def _kill(proc):
    """SIGKILL a child that outlived its grace: its group, and every process below it, found before it dies (a child
    killed before it passed a signal on would orphan the children it started in sessions of their own)."""
    below = descendants(proc.pid)
    _signal_group(proc, signal.SIGKILL)
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _end_children(signum):
    """Every child still running gets signum (once: not one the signal handler reached already), up to GRACE_S to
    end, then SIGKILL."""
    with _lock:
        _state['ending'] = True
        running = [p for p in _children if p.poll() is None]
        for proc in running:
            if proc.pid not in _state['signalled']:
                _signal_group(proc, signum)
                _state['signalled'].add(proc.pid)
    deadline = time.monotonic() + GRACE_S
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill(proc)
            proc.wait()
        _signal_group(proc, signal.SIGKILL)   # what the child left in its group (a rank, a worker) ends with it
    with _lock:
        _children[:] = [p for p in _children if p.poll() is None]


def _say(line):
    if os.environ.get('RANK', '0') == '0':   # under torchrun, rank 0 alone: one line for the launch
        print(line, file=sys.stderr, flush=True)
