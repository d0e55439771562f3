"""The cost of train.py's probe (docs/reproducing.md, "Outlier dynamics during training"):

    python docs/probe_cost.py config/tiny_cpu.py --init_from=scratch --out_dir=out/cost_tiny   # any train.py arguments
    python docs/probe_cost.py --gpt2_130m         # one probe of GPT-2 130M on the CPU beside a training step

The first form runs train.py's main with every call of train.probe timed and prints the wall and CPU time spent
in it against the whole run's. The second times one probe (probe_docs of data/pinned_cpu's validation documents) of
a randomly initialised config/gpt2_130m.py model and one forward and backward of 4 x 256 tokens, and extrapolates
the latter to eval_interval iterations of the config's batch (512 x 256 tokens). Either runs from any folder: the
first form's paths are train.py's (relative to the working directory), the second's are this repository's.
"""
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository: this file is docs/probe_cost.py
sys.path.insert(0, ROOT)
from harness.entry import early_exit_on_signal  # noqa: E402   first: a signal while torch loads is one line
early_exit_on_signal(__name__)

import torch  # noqa: E402

import train  # noqa: E402
from harness.entry import run_script  # noqa: E402


def timed_run(argv):
    wall, cpu, probe = [], [], train.probe

    def timed(*args):
        t, c = time.perf_counter(), time.process_time()
        result = probe(*args)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        return result
    train.probe = timed
    t, c = time.perf_counter(), time.process_time()
    code = train.main(argv)
    total, total_cpu = time.perf_counter() - t, time.process_time() - c
    if code and code < 128:   # train.py said what was wrong (its one line): no run to time (a signal's 128 + N: timed)
        return code
    print(f"probe: {len(wall)} calls, wall {sum(wall):.3f} s of {total:.1f} s = {100 * sum(wall) / total:.2f}%, "
          f"cpu {sum(cpu):.3f} s of {total_cpu:.1f} s = {100 * sum(cpu) / total_cpu:.2f}%; per call (wall): "
          f"{', '.join(f'{x:.3f}' for x in wall)}")
    return code


def gpt2_130m():
    from configurator import load_config
    from model import GPT, GPTConfig
    from harness.dataset import load_meta
    from harness.train_config import CHOICES, DEFAULTS, MODEL_KEYS, RANGES
    cfg = load_config(DEFAULTS, [os.path.join(ROOT, 'config', 'gpt2_130m.py'), '--dataset=offline'], CHOICES, RANGES)
    cfg['vocab_size'] = 50304
    data = os.path.relpath(os.path.join(ROOT, 'data', 'pinned_cpu'))   # the repository's, named as from its root
    try:
        meta = load_meta(data)
    except ValueError as e:   # not prepared: the message says how to prepare it
        sys.exit(f"probe_cost.py: error: {e}")
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{k: cfg[k] for k in MODEL_KEYS}))
    for _ in range(2):   # the second of each is reported
        t = time.perf_counter()
        p = train.probe(model, cfg, meta, os.path.join(data, 'val.bin'), None, 'cpu')
        probe = time.perf_counter() - t
    x = torch.randint(0, meta['vocab_size'], (4, cfg['block_size'] + 1))
    for _ in range(2):
        t = time.perf_counter()
        model(x[:, :-1], x[:, 1:])[1].backward()
        step = time.perf_counter() - t
    rows = cfg['batch_size'] * cfg['gradient_accumulation_steps']
    between = step * rows / 4 * cfg['eval_interval']
    print(f"probe of {p['documents']} documents: {probe:.2f} s; forward and backward of 4 x {cfg['block_size']}: "
          f"{step:.2f} s, so {cfg['eval_interval']} iterations of {rows} x {cfg['block_size']} ~ {between:.3g} s; "
          f"share {probe / between:.1e}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ('-h', '--help') for a in argv):
        print(f"{__doc__.strip()}\n\ntrain.py's arguments: python train.py --help")
        return 0
    return gpt2_130m() if argv == ['--gpt2_130m'] else timed_run(argv)


if __name__ == '__main__':
    run_script(main)
