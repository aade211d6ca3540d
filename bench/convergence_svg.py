#!/usr/bin/env python3
"""Validation-loss curves of several runs as one SVG, and a table of their final values.

Usage: bench/convergence_svg.py --out curves.svg LABEL=metrics.jsonl [LABEL=metrics.jsonl ...]

Runs sharing a LABEL (several seeds of one configuration) are drawn in one colour, each seed its own line;
the table gives each label's final validation loss per seed and the mean. Written for the bf16-against-fp32
convergence record (docs/precision.md), usable for any set of `meshtrain train --metrics` files.
Standard library only: the SVG is written by hand (a few polylines, axes and a legend).
"""
import argparse
import json
import sys
from collections import OrderedDict

COLOURS = ["#1f5fa8", "#c8501e", "#2e8b3d", "#7a3fa0", "#8a6d1a"]


def val_curve(path, x_axis="step"):
    """[(x, val_loss)]: x the step count after the evaluated step, or (x_axis "time") the training seconds
    so far (the rows' step_time_s summed up to and including the evaluated step)."""
    pts, t = [], 0.0
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not a JSON line ({e})")
            t += float(row.get("step_time_s", 0.0))
            if row.get("val_loss") is not None:
                pts.append((t if x_axis == "time" else int(row["step"]) + 1, float(row["val_loss"])))
    if not pts:
        sys.exit(f"{path}: no val_loss rows (train with --val-data and --eval-every)")
    return pts


def svg(groups, width=720, height=400, title="validation loss", x_label="step"):
    L, R, T, B = 60, 150, 30, 45
    xs = [x for runs in groups.values() for _, c in runs for x, _ in c]
    ys = [y for runs in groups.values() for _, c in runs for _, y in c]
    x0, x1 = 0, max(xs)
    y0, y1 = min(ys), max(ys)
    pad = (y1 - y0) * 0.05 or 0.05
    y0, y1 = y0 - pad, y1 + pad
    sx = lambda x: L + (x - x0) / (x1 - x0) * (width - L - R)
    sy = lambda y: T + (y1 - y) / (y1 - y0) * (height - T - B)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{L}" y="18" font-size="14">{title}</text>']
    for k in range(6):  # y grid and labels
        y = y0 + (y1 - y0) * k / 5
        out.append(f'<line x1="{L}" x2="{width - R}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{L - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:.3f}</text>')
    for k in range(5):  # x labels
        x = x0 + (x1 - x0) * k / 4
        out.append(f'<text x="{sx(x):.1f}" y="{height - B + 16}" text-anchor="middle">'
                   f'{int(x) if x1 >= 20 else round(x, 1)}</text>')
    out.append(f'<text x="{(L + width - R) / 2}" y="{height - 8}" text-anchor="middle">{x_label}</text>')
    out.append(f'<rect x="{L}" y="{T}" width="{width - L - R}" height="{height - T - B}" fill="none" stroke="#888"/>')
    for i, (label, runs) in enumerate(groups.items()):
        colour = COLOURS[i % len(COLOURS)]
        dash = ' stroke-dasharray="5,3"' if i % 2 else ""
        for _, c in runs:
            pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in c)
            out.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="1.4"{dash}/>')
        ly = T + 16 + 18 * i
        out.append(f'<line x1="{width - R + 10}" x2="{width - R + 34}" y1="{ly - 4}" y2="{ly - 4}" '
                   f'stroke="{colour}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{width - R + 40}" y="{ly}">{label} ({len(runs)} run{"s" if len(runs) > 1 else ""})</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="SVG file to write")
    ap.add_argument("--title", default="validation loss")
    ap.add_argument("--x", choices=("step", "time"), default="step",
                    help="x axis: steps, or training seconds (the metrics' step_time_s summed)")
    ap.add_argument("runs", nargs="+", help="LABEL=metrics.jsonl")
    a = ap.parse_args()
    groups = OrderedDict()
    for spec in a.runs:
        label, sep, path = spec.partition("=")
        if not sep:
            sys.exit(f"{spec}: expected LABEL=metrics.jsonl")
        groups.setdefault(label, []).append((path, val_curve(path, a.x)))
    with open(a.out, "w") as f:
        f.write(svg(groups, title=a.title, x_label="step" if a.x == "step" else "training seconds"))
    finals = {}
    print("| run | final validation loss per run | mean |")
    print("|---|---|---|")
    for label, runs in groups.items():
        v = [c[-1][1] for _, c in runs]
        finals[label] = sum(v) / len(v)
        print(f"| {label} | {' '.join(f'{x:.4f}' for x in v)} | {finals[label]:.4f} |")
    labels = list(finals)
    for other in labels[1:]:
        print(f"{other} / {labels[0]} mean final validation loss: {finals[other] / finals[labels[0]]:.4f}")


if __name__ == "__main__":
    main()
