"""ROC and CMC plots as PNG files, drawn with OpenCV (no plotting library is a dependency)."""
from __future__ import annotations

import cv2
import numpy as np

WIDTH, HEIGHT = 720, 520
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 60          # margins around the axes, pixels
COLOURS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189)]   # RGB
FONT = cv2.FONT_HERSHEY_SIMPLEX


def _text(canvas, text, x, y, scale=0.45, colour=(0, 0, 0)):
    cv2.putText(canvas, text, (int(x), int(y)), FONT, scale, colour, 1, cv2.LINE_AA)


def draw(path: str, curves: "dict[str, tuple]", x_range, y_range, x_ticks, x_label: str, y_label: str,
         title: str, log_x: bool = False) -> None:
    """Write a line plot of curves {label: (x, y)} to `path`; log_x draws x on a log10 scale."""
    canvas = np.full((HEIGHT, WIDTH, 3), 255, np.uint8)
    to_axis = (lambda v: np.log10(np.maximum(v, 1e-300))) if log_x else (lambda v: np.asarray(v, float))
    (x0, x1), (y0, y1) = to_axis(np.array(x_range, float)), y_range
    width, height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def pixel(x, y):
        px = LEFT + (to_axis(x) - x0) / (x1 - x0) * width
        py = TOP + (1 - (np.asarray(y, float) - y0) / (y1 - y0)) * height
        return px, py

    for tick in x_ticks:                    # vertical grid and x labels
        px, _ = pixel(tick, y0)
        cv2.line(canvas, (int(px), TOP), (int(px), TOP + height), (220, 220, 220), 1)
        _text(canvas, f"{tick:g}", px - 14, TOP + height + 18)
    for tick in np.linspace(y0, y1, 6):     # horizontal grid and y labels
        _, py = pixel(x_range[0], tick)
        cv2.line(canvas, (LEFT, int(py)), (LEFT + width, int(py)), (220, 220, 220), 1)
        _text(canvas, f"{tick:.2f}", 18, py + 5)
    cv2.rectangle(canvas, (LEFT, TOP), (LEFT + width, TOP + height), (0, 0, 0), 1)
    for i, (label, (xs, ys)) in enumerate(curves.items()):
        colour = COLOURS[i % len(COLOURS)]
        xs, ys = np.asarray(xs, float), np.asarray(ys, float)
        keep = (xs > 0) if log_x else np.ones(len(xs), bool)
        px, py = pixel(np.clip(xs[keep], *x_range), np.clip(ys[keep], *y_range))
        points = np.stack([px, py], axis=1).round().astype(np.int32)
        cv2.polylines(canvas, [points], False, colour, 2, cv2.LINE_AA)
        cv2.line(canvas, (LEFT + 10, TOP + 18 + 18 * i), (LEFT + 35, TOP + 18 + 18 * i), colour, 2)
        _text(canvas, label, LEFT + 42, TOP + 23 + 18 * i)
    _text(canvas, title, LEFT, 25, 0.55)
    _text(canvas, x_label, LEFT + width / 2 - 40, HEIGHT - 15)
    _text(canvas, y_label, 5, TOP - 8)
    if not cv2.imwrite(path, canvas[:, :, ::-1]):
        raise OSError(f"{path}: cannot write the plot")


def draw_roc(path: str, curves: "dict[str, tuple]", title: str) -> None:
    """ROC curves {label: (fpr, tpr)}, FAR 1e-6..1 on a log scale."""
    draw(path, curves, (1e-6, 1.0), (0.0, 1.0), [10.0 ** e for e in range(-6, 1)], "FAR (log)", "TAR",
         title, log_x=True)


def draw_cmc(path: str, curves: "dict[str, tuple]", title: str) -> None:
    """CMC curves {label: (ranks, identification rate)}."""
    top = max(int(np.max(ranks)) for ranks, _ in curves.values())
    draw(path, curves, (1, max(top, 2)), (0.0, 1.0), sorted({1, *range(5, top + 1, 5)}), "rank", "identification rate",
         title)
