"""How the GPU queue (tools/gpu_queue.py, docs/gpu-queue.md) runs one call of an item: the call's deadline and its
status.json (Call: in QUEUE_DIR on the machine, copied to --out after every change), and each step of it, a command
in its own process group stopped when its time or the call's runs out (run_step). A step stopped by the deadline or a
signal is run again by the next call; a step that failed is recorded with its own error line (error_line), and the
call ends with one line saying what failed (StepFailed)."""
import collections
import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

from harness.entry import start_child, stop_child, stopping
from harness.fileio import write_json
from harness.recipe import stopped_by

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUEUE_DIR = os.path.join('out', 'gpu_queue')   # what a call leaves on the machine for the next one


class QueueError(Exception):
    """One line for the user: what is wrong and what to do."""


class StepFailed(QueueError):
    """Steps of a call that failed (exit non-zero, not by a signal or the deadline): [{"step", "rc", "error"}]. Called
    again as it is, the call would fail the same way: the line says what failed, with the step's own error line."""

    def __init__(self, failures):
        first = failures[0]
        more = f" (and {len(failures) - 1} more step(s): status.json \"failed\")" if len(failures) > 1 else ''
        super().__init__(f"{first['step']} failed (exit {first['rc']}): {first['error']}{more}; fix that, then run "
                         f"the same command (as it is, it fails the same way)")
        self.failures = failures


FIX_NEXT = 'fix what "error" says, then run the same command (called again as it is, it fails the same way)'


# ----------------------------------------------------------------------------- the state a call leaves
class Call:
    """One call of an item: its deadline, its status (status.json, in QUEUE_DIR and copied to --out)."""

    def __init__(self, item, out, minutes, mini, commit, work=ROOT, dataset=None):
        self.item, self.out, self.mini, self.work, self.dataset = item, out, mini, work, dataset
        self.t0, self.deadline = time.time(), time.time() + 60 * minutes
        self.state_dir = os.path.join(work, QUEUE_DIR, item.name + ('_mini' if mini else ''))
        os.makedirs(self.state_dir, exist_ok=True)
        path = os.path.join(self.state_dir, 'status.json')
        try:
            with open(path) as f:
                self.status = json.load(f)
        except (OSError, ValueError):
            self.status = {'item': item.name, 'kind': item.kind, 'mini': mini, 'calls': [], 'rows': {}, 'steps': {}}
        for stale in ('error', 'failed'):   # an earlier call's failure: this call says its own
            self.status.pop(stale, None)
        self.status.update(commit=commit, device=device_name(), torch=torch_version(), complete=False,
                           next='call again with the same command')
        self.status['calls'].append({'call': len(self.status['calls']) + 1, 'minutes': minutes,
                                     'started': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
                                     'seconds': 0, 'outcome': 'running'})
        self.lock = threading.Lock()
        self.save()

    def left(self):
        return self.deadline - time.time()

    def save(self, outcome=None):
        with self.lock:
            call = self.status['calls'][-1]
            call['seconds'] = round(time.time() - self.t0, 1)
            if outcome:
                call['outcome'] = outcome
            write_json(os.path.join(self.state_dir, 'status.json'), self.status, indent=1)
            write_json(os.path.join(self.out, 'status.json'), self.status, indent=1)


def device_name():
    """The machine's device as every output's provenance names it (harness/provenance.py); None without torch."""
    if importlib.util.find_spec('torch') is None:
        return None
    import torch
    from harness import provenance
    return provenance.device_name('cuda' if torch.cuda.is_available() else 'cpu')


def torch_version():
    spec = importlib.util.find_spec('torch')
    if spec is None:
        return None
    from importlib.metadata import version
    return version('torch')


def run_step(call, name, cmd, seconds, log=None, env=None):
    """A command in its own process group, stopped (SIGTERM, then SIGKILL) when `seconds` or the call's deadline
    less 20 s run out; output to `log` (a file under --out) or to this console (its stderr relayed line by line, so
    that its error line can be quoted). Records {"rc", "seconds"} in the status ("rc": null when it was stopped: by
    the deadline, or by a signal, which train.py and reproduce.py report as exit 128 + its number after their
    checkpoint, recipe.stopped_by; then "stopped_by" names it): a stopped step is run again by the next call. Any other
    non-zero exit is a failure: "error" records the step's own error line (error_line). Returns the exit code or
    None."""
    limit = max(1.0, min(seconds, call.left() - 20))
    t, sink = time.time(), open(log, 'w') if log else None
    proc = start_child(cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT if sink else subprocess.PIPE,
                       env={**os.environ, 'PYTHONUNBUFFERED': '1', **(env or {})})
    said = collections.deque(maxlen=200)   # the last lines of its stderr (no log)

    def relay():
        for raw in proc.stderr:
            line = raw.decode(errors='replace')
            said.append(line)
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(line)
                sys.stderr.flush()
    reader = None if sink else threading.Thread(target=relay, daemon=True)
    if reader:
        reader.start()
    try:
        rc = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        rc = None
        stop_child(proc, grace=15)   # SIGTERM to its group: train.py writes a checkpoint; the next call resumes it
    except KeyboardInterrupt:   # a signal to this call, passed on to the step (start_child): stopped, run again
        call.status['steps'][name] = {'rc': None, 'seconds': round(time.time() - t, 1),
                                      'stopped_by': (stopping() or signal.SIGINT).name}
        call.save('stopped')
        raise
    finally:
        if sink:
            sink.close()
    if reader:
        reader.join(timeout=10)   # the rest of its stderr (a child of its own may hold the pipe: not for long)
    stopped = stopped_by(rc)
    failed = rc not in (0, None) and not stopped
    if failed and log:
        with contextlib.suppress(OSError), open(log, errors='replace') as f:
            said.extend(f.readlines()[-200:])
    call.status['steps'][name] = {'rc': None if stopped else rc, 'seconds': round(time.time() - t, 1),
                                  **({'stopped_by': stopped.name} if stopped else {}),
                                  **({'error': error_line(said)} if failed else {})}
    call.save()
    return None if stopped else rc


def error_line(lines):
    """A failed step's own error line: its last line that is one (`error: ...`, `reproduce.py: error: ...`,
    argparse's `reproduce.py: error: argument ...`), else its last line."""
    lines = [line.strip() for line in lines if line.strip()]
    errors = [line for line in lines if re.match(r'(?:[^:\s][^:]*: )?error: ', line)]
    return (errors or lines or ['(it printed nothing)'])[-1][:2000]


def step_failure(call, name):
    """{"step", "rc", "error"} of a step run_step recorded as failed."""
    step = call.status['steps'][name]
    return {'step': name, 'rc': step['rc'], 'error': step.get('error')}
