"""The README's figure: for each model, its hidden-state channels (Fig. 1b) beside its attention map (Fig. 1a), both of
the first validation document, composed from the figures analyze.py --plots drew (no model runs, no network):

    python docs/front_figure.py                          # SmolLM2 on the pinned corpus -> docs/figures/front.png
    python docs/front_figure.py docs/figures/smollm2-pinned docs/figures/laptop --out F.png   # a row per folder

Each folder holds analyze.py --plots output for one model: hidden_states.png, and attention_map.png or else
attention_layers.png, whose first panel (mean over layers) is the same map. The pixels are copied, not redrawn or
resampled, so the figure says exactly what those figures say; run this again after analyze.py redraws them.
The output is a function of those PNG files: run on docs/figures/smollm2-pinned (the default) it writes the tracked
docs/figures/front.png byte for byte, with the same matplotlib (its version is written in the PNG's Software field).
A figure that is not a whole PNG is a one-line error, nothing written.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)   # the repository: this file is docs/front_figure.py (not the working directory)
sys.path.insert(0, ROOT)
from harness.entry import early_exit_on_signal  # noqa: E402   first: a signal while the rest loads is one line
early_exit_on_signal(__name__)

import numpy as np  # noqa: E402

from harness.entry import run_script  # noqa: E402
from harness.fileio import atomic_write, check_output, disk_full, disk_full_text, path_arg  # noqa: E402

GAP = 24          # white pixels between panels and between rows


def true_runs(mask):
    """(start, end) of each run of True in a 1-D mask."""
    edges = np.flatnonzero(np.diff(np.r_[0, mask.astype(np.int8), 0]))
    return list(zip(edges[::2], edges[1::2]))


def longest_run(mask):
    """Per column of a 2-D mask, the length of its longest vertical run of True."""
    best = np.zeros(mask.shape[1], dtype=int)
    cur = np.zeros(mask.shape[1], dtype=int)
    for line in mask:
        cur = np.where(line, cur + 1, 0)
        best = np.maximum(best, cur)
    return best


def first_panel(img):
    """The first panel of analyze.py's Appendix K figure (mean over layers; the others are single layers), without
    the figure's title line. Panels are found from their solid blocks of pixels, the attention image and its
    colour bar (text is broken by the spaces between letters); the cut is the widest all-white gap between the first
    colour bar and the second image: the space between two panels, wider than a label's padding."""
    white = img.min(-1) > 0.99
    rows = true_runs(white.all(1))
    top = (rows[1][0] + rows[1][1]) // 2 if len(rows) > 1 and rows[0][0] == 0 else 0   # below the title line
    runs = longest_run(~white[top:])
    blocks = true_runs(runs >= 0.6 * runs.max())              # image 1, colour bar 1, image 2, ...
    if len(blocks) < 3:
        sys.exit("front_figure.py: error: attention_layers.png has one panel only; draw attention_map.png instead")
    gaps = [(a, b) for a, b in true_runs(white[top:].all(0)) if blocks[1][1] < a and b <= blocks[2][0]]
    a, b = max(gaps, key=lambda g: g[1] - g[0]) if gaps else (blocks[1][1], blocks[2][0])
    right = (a + b) // 2
    return img[top:, :right]


def row(folder):
    need = ['hidden_states.png']
    attn = os.path.join(folder, 'attention_map.png')
    if not os.path.exists(attn):
        attn, need = os.path.join(folder, 'attention_layers.png'), need + ['attention_layers.png']
    for name in need:
        if not os.path.exists(os.path.join(folder, name)):
            sys.exit(f"front_figure.py: error: {folder} has no {name}; draw it with analyze.py ... --plots {folder}")
    hidden, attention = read_png(os.path.join(folder, 'hidden_states.png')), read_png(attn)
    if attn.endswith('attention_layers.png'):
        attention = first_panel(attention)
    return side_by_side([hidden, attention])


def read_png(path):
    """The RGB pixels (H, W, 3) of a PNG file in [0, 1]; a file that is not a whole PNG (cut short, another format,
    text) is a one-line exit."""
    import matplotlib.image as mpimg
    try:
        img = mpimg.imread(path, format='png')
    except (OSError, SyntaxError, ValueError) as e:   # PIL: 'image file is truncated', 'not a PNG file'
        sys.exit(f"front_figure.py: error: {path} is not a whole PNG file ({type(e).__name__}: {e}); draw it again "
                 f"with analyze.py ... --plots {os.path.dirname(path) or '.'}")
    if img.ndim == 2:                                  # greyscale
        img = np.repeat(img[..., None], 3, axis=-1)
    return img[..., :3].astype(np.float32) if img.dtype.kind == 'f' else img[..., :3] / np.float32(255)


def pad(img, height=None, width=None):
    h, w = img.shape[:2]
    out = np.ones((height or h, width or w, 3), dtype=img.dtype)
    top = ((height or h) - h) // 2
    out[top:top + h, :w] = img
    return out


def side_by_side(imgs):
    height = max(i.shape[0] for i in imgs)
    parts = []
    for i in imgs:
        parts += [pad(i, height=height), np.ones((height, GAP, 3), dtype=i.dtype)]
    return np.concatenate(parts[:-1], axis=1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('folders', nargs='*', type=path_arg, default=[os.path.join(HERE, 'figures', 'smollm2-pinned')],
                   help='one folder of analyze.py --plots figures per row (default: docs/figures/smollm2-pinned, '
                        'the README\'s figure)')
    p.add_argument('--out', type=path_arg, default=os.path.join(HERE, 'figures', 'front.png'),
                   help='the PNG to write')
    args = p.parse_args(argv)
    inputs = [os.path.join(f, name) for f in args.folders
              for name in ('hidden_states.png', 'attention_map.png', 'attention_layers.png')]
    try:
        check_output(args.out, '--out', inputs=inputs, make=True)
    except ValueError as e:
        sys.exit(f"front_figure.py: error: {e}")
    rows = [row(f) for f in args.folders]
    width = max(r.shape[1] for r in rows)
    parts = []
    for r in rows:
        parts += [pad(r, width=width), np.ones((GAP, width, 3), dtype=r.dtype)]
    img = np.concatenate(parts[:-1], axis=0)
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    try:
        with atomic_write(args.out, 'wb') as f:
            plt.imsave(f, img, format='png')
    except OSError as e:
        sys.exit(f"front_figure.py: error: {disk_full_text(args.out) if disk_full(e) else e}")
    print(f"{os.path.relpath(args.out)}: {img.shape[1]} x {img.shape[0]} pixels, {len(rows)} row(s)")


if __name__ == '__main__':
    run_script(main)
