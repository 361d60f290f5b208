"""Step through tensor-parallel MLP Y = GeLU(X A) B on N ranks, column-then-row or the wrong order.

``derive(order, num_ranks, tokens, hidden, ffn)`` runs the real math on small random float32
tensors in this one process: rank r's shards are slices of the full A (d x f) and B (f x d),
a collective is done by hand on the ranks' tensors (an all-reduce is their sum), and every
shape and error the widget shows is read off those tensors.

  column then row (Megatron)   A_r = A[:, r f/N : (r+1) f/N] (column shard), so X A_r holds the
                               complete pre-activations of rank r's f/N hidden features and GeLU,
                               elementwise, is exact on them; B_r = B[r f/N : (r+1) f/N, :] (row
                               shard) turns them into a partial Z_r (T x d) of Y = sum_r Z_r:
                               one all-reduce forward.
  A by rows (the wrong order)  A_r = A[r d/N : (r+1) d/N, :] takes X's matching columns X_r, so
                               X_r A_r (T x f) is a partial sum of every pre-activation, and
                               GeLU(sum) != sum of GeLUs: an all-reduce (of T x f, f/d times the
                               right order's message) must come before the nonlinearity. B is then
                               split by columns, and the ranks' output columns are all-gathered:
                               two collectives forward, as ``collectives.tensor_parallel.wrong_order_mlp``
                               makes on real ranks.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import ipywidgets as w
import torch
import torch.nn.functional as F

from course_lib.checks import require_count
from course_lib.collectives.tensor_parallel import _shard
from course_lib.perf.units import format_bytes
from course_lib.widgets.figure_pane import one_at_a_time
from course_lib.widgets.rank_view import RANK_COLOURS

RIGHT, WRONG = "column-row", "row-column"
ORDERS = {RIGHT: "column then row (Megatron)", WRONG: "A split by rows (wrong order)"}
RANK_COUNTS = (2, 4)
COMM_COLOUR = "#d62728"


@dataclass(frozen=True)
class Step:
    """One step: it adds tensor ``label`` on every rank; ``collective`` names the communication the
    step needs ("all-reduce", "all-gather") and is None when every rank works alone."""
    label: str
    title: str
    note: str
    collective: str | None = None


@dataclass(frozen=True)
class Derivation:
    """The computed walk-through. Invariants: ``shapes[r][step.label]`` is the shape of rank r's
    tensor for each step, read from the tensor; ``collectives`` lists the steps' collectives in
    order, each with its message bytes per rank; ``output_error`` is max |Y_parallel - GeLU(X A) B|
    (float32 rounding, ~1e-7, for both orders: the wrong order is correct, only dearer);
    ``nonlinearity_error`` is, for the right order, max |GeLU(X A_r) - GeLU(X A)[:, columns r]|
    (rounding), for the wrong order max |GeLU(sum_r P_r) - sum_r GeLU(P_r)| (far from 0: what
    skipping the middle all-reduce would cost)."""
    order: str
    num_ranks: int
    tokens: int
    hidden: int
    ffn: int
    steps: tuple[Step, ...]
    shapes: tuple[dict[str, tuple[int, ...]], ...]
    collectives: tuple[tuple[str, int], ...]
    nonlinearity_error: float
    output_error: float
    skipped_error: float | None = None
    """Wrong order only: max |sum_r GeLU(P_r) B - Y|, the output had the middle all-reduce been skipped."""


def _max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _shapes(per_rank: list[dict[str, torch.Tensor]]) -> tuple[dict[str, tuple[int, ...]], ...]:
    """Every rank's tensors by label -> their shapes."""
    return tuple({label: tuple(t.shape) for label, t in tensors.items()} for tensors in per_rank)


def derive(order: str = RIGHT, num_ranks: int = 2, tokens: int = 4, hidden: int = 8, ffn: int = 32,
           seed: int = 0) -> Derivation:
    """Run Y = GeLU(X A) B split over ``num_ranks`` in ``order`` (``RIGHT`` or ``WRONG``) on random
    float32 X (tokens x hidden), A (hidden x ffn), B (ffn x hidden); see ``Derivation``."""
    for name, value in (("num_ranks", num_ranks), ("tokens", tokens), ("hidden", hidden), ("ffn", ffn)):
        require_count(name, value)
    if order not in ORDERS:
        raise ValueError(f"order must be one of {list(ORDERS)}, got {order!r}.")
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=generator)
    # scaled as nn.Linear initialises (1/sqrt(fan_in)), so every value is of order 1 and float32 rounding ~1e-7
    a = torch.randn(hidden, ffn, generator=generator) / hidden ** 0.5
    b = torch.randn(ffn, hidden, generator=generator) / ffn ** 0.5
    expected = F.gelu(x @ a) @ b
    ranks = range(num_ranks)
    n, item = num_ranks, x.element_size()
    if order == RIGHT:
        cols = [_shard(ffn, r, n, "ffn") for r in ranks]
        a_r = [a[:, c] for c in cols]
        pre = [x @ ar for ar in a_r]
        act = [F.gelu(p) for p in pre]
        b_r = [b[c, :] for c in cols]
        z = [h @ br for h, br in zip(act, b_r)]
        y = torch.stack(z).sum(0)  # the all-reduce
        full_act = F.gelu(x @ a)
        nonlinearity = max(_max_error(h, full_act[:, c]) for h, c in zip(act, cols))
        per_rank = [{"X": x, "A_r": ar, "X A_r": p, "GeLU(X A_r)": h, "B_r": br, "Z_r": zr, "Y": y}
                    for ar, p, h, br, zr in zip(a_r, pre, act, b_r, z)]
        message = y.numel() * item
        steps = (
            Step("X", "every rank holds the whole input X", f"X is {tokens} tokens x d = {hidden}, replicated."),
            Step("A_r", "split A by columns", f"rank r keeps columns r·f/N of A: d x f/N = {hidden} x {ffn // n}."),
            Step("X A_r", "multiply: complete pre-activations", f"X A_r is T x f/N: every entry is a whole dot product "
                 f"over all d = {hidden} inputs, exactly the matching columns of X A. No communication."),
            Step("GeLU(X A_r)", "GeLU on whole values: exact", "GeLU acts entry by entry on complete values, so "
                 f"GeLU(X A_r) equals columns r·f/N of GeLU(X A): max difference {nonlinearity:.1e} (float32 "
                 "rounding). No communication."),
            Step("B_r", "split B by rows", f"rank r keeps the rows of B that meet its f/N = {ffn // n} hidden "
                 f"features: f/N x d = {ffn // n} x {hidden}."),
            Step("Z_r", "multiply: a partial sum of Y", f"Z_r = GeLU(X A_r) B_r is T x d = {tokens} x {hidden}, "
                 "rank r's share of every output: Y = Z_0 + ... + Z_(N-1)."),
            Step("Y", "all-reduce: Y = sum of the Z_r", f"One all-reduce of T x d = {format_bytes(message)} per rank; "
                 f"every rank ends with Y. max |Y - GeLU(X A) B| = {_max_error(y, expected):.1e}.", "all-reduce"),
        )
        return Derivation(order, n, tokens, hidden, ffn, steps, _shapes(per_rank), (("all-reduce", message),),
                          nonlinearity, _max_error(y, expected))
    rows = [_shard(hidden, r, n, "hidden") for r in ranks]
    x_r = [x[:, s] for s in rows]
    a_r = [a[s, :] for s in rows]
    partial = [xr @ ar for xr, ar in zip(x_r, a_r)]
    total = torch.stack(partial).sum(0)  # the middle all-reduce
    hidden_act = F.gelu(total)
    summed_gelus = torch.stack([F.gelu(p) for p in partial]).sum(0)
    nonlinearity = _max_error(hidden_act, summed_gelus)
    cols = [_shard(hidden, r, n, "hidden") for r in ranks]
    b_r = [b[:, c] for c in cols]
    y_r = [hidden_act @ br for br in b_r]
    y = torch.cat(y_r, dim=1)  # the all-gather
    per_rank = [{"X_r": xr, "A_r": ar, "P_r = X_r A_r": p, "H = GeLU(sum P_r)": hidden_act, "B_r": br, "Y_r": yr,
                 "Y": y} for xr, ar, p, br, yr in zip(x_r, a_r, partial, b_r, y_r)]
    middle, gathered = total.numel() * item, y.numel() * item
    steps = (
        Step("X_r", "every rank takes d/N columns of X", f"X_r is T x d/N = {tokens} x {hidden // n}: the inputs "
             "that meet rank r's rows of A."),
        Step("A_r", "split A by rows", f"rank r keeps rows r·d/N of A: d/N x f = {hidden // n} x {ffn}."),
        Step("P_r = X_r A_r", "multiply: partial sums", f"P_r is T x f = {tokens} x {ffn}: every pre-activation, "
             f"but summed over only d/N = {hidden // n} of the d inputs. X A = P_0 + ... + P_(N-1)."),
        Step("H = GeLU(sum P_r)", "all-reduce before GeLU", "GeLU of a sum is not the sum of GeLUs: max |GeLU(sum P_r) "
             f"- sum GeLU(P_r)| = {nonlinearity:.2f}. So the partials are all-reduced first: T x f = "
             f"{format_bytes(middle)} per rank, f/d = {ffn / hidden:g} times the right order's message.",
             "all-reduce"),
        Step("B_r", "split B by columns", f"every rank holds all of H, so rank r takes d/N columns of B: "
             f"f x d/N = {ffn} x {hidden // n}."),
        Step("Y_r", "multiply: rank r's output columns", f"Y_r = H B_r is T x d/N = {tokens} x {hidden // n}: "
             "complete, but only rank r's columns of Y."),
        Step("Y", "all-gather: Y = [Y_0 ... Y_(N-1)]", f"A second collective: every rank gathers the others' "
             f"columns ({format_bytes(gathered)} in all). max |Y - GeLU(X A) B| = {_max_error(y, expected):.1e}: "
             "right, at twice the collectives.", "all-gather"),
    )
    skipped = _max_error(summed_gelus @ b, expected)
    return Derivation(order, n, tokens, hidden, ffn, steps, _shapes(per_rank),
                      (("all-reduce", middle), ("all-gather", gathered)), nonlinearity, _max_error(y, expected),
                      skipped)


def _box(shape: tuple[int, ...], colour: str, comm: str | None, current: bool) -> str:
    """A cell: the shape and a rectangle drawn to scale (3 px per element, at most 96 px a side)."""
    rows, cols = shape
    border = f"3px solid {COMM_COLOUR}" if comm else "2px solid #222" if current else "1px solid #999"
    picture = (f"<div style='width:{min(3 * cols, 96)}px;height:{min(3 * rows, 96)}px;background:{colour};"
               "margin:3px auto'></div>")
    tag = f"<br><b style='color:{COMM_COLOUR}'>&#8644; {comm}</b>" if comm else ""
    return (f"<td style='border:{border};padding:3px 6px;text-align:center;vertical-align:top'>"
            f"{rows} x {cols}{picture}{tag}</td>")


def render_step(derivation: Derivation, step: int) -> str:
    """HTML: a row per rank, a column per tensor up to ``step`` (0-based), each with its shape;
    tensors not yet computed stay empty, a collective's cell has a red border."""
    shown = derivation.steps[:step + 1]
    head = "".join(f"<th style='padding:2px 6px'>{html.escape(s.label)}</th>" for s in derivation.steps)
    body = []
    for rank, shapes in enumerate(derivation.shapes):
        colour = RANK_COLOURS[rank % len(RANK_COLOURS)]
        cells = [_box(shapes[s.label], colour if s.collective is None else "#8c8c8c", s.collective, i == step)
                 for i, s in enumerate(shown)]
        cells += ["<td style='border:1px dashed #ddd'></td>"] * (len(derivation.steps) - len(shown))
        body.append(f"<tr><td><b style='color:{colour}'>rank {rank}</b></td>{''.join(cells)}</tr>")
    current = derivation.steps[step]
    comm = (f"<b style='color:{COMM_COLOUR}'>communication: {current.collective}</b>" if current.collective
            else "no communication")
    return (f"<div style='font-family:sans-serif;font-size:13px'>"
            f"<b>Step {step + 1} of {len(derivation.steps)}: {html.escape(current.title)}</b> ({comm})<br>"
            f"{html.escape(current.note)}"
            f"<table style='border-collapse:separate;border-spacing:3px;margin-top:4px'><tr><th></th>{head}</tr>"
            f"{''.join(body)}</table><small>shapes are rows x columns of each rank's tensor (T = "
            f"{derivation.tokens} tokens, d = {derivation.hidden}, f = {derivation.ffn}, N = {derivation.num_ranks}); "
            f"grey with a red border: the result of a collective, the same on every rank.</small></div>")


def summary(derivation: Derivation, other: Derivation) -> str:
    """HTML: the collectives of this order and of the other, with their bytes per rank."""
    def listing(d: Derivation) -> str:
        calls = ", ".join(f"{name} of {format_bytes(size)}" for name, size in d.collectives)
        count = len(d.collectives)
        return f"{ORDERS[d.order]}: <b>{count} collective{'s' if count > 1 else ''}</b> ({calls})"
    wrong = derivation if derivation.order == WRONG else other
    return (f"<div style='font-family:sans-serif;font-size:13px'>Forward, per MLP: {listing(derivation)}; "
            f"{listing(other)}. Without the middle all-reduce the wrong order's output is off by up to "
            f"{wrong.skipped_error:.2f}.</div>")


class TPDerivation(w.VBox):
    """Previous/next buttons and a step slider over ``derive``'s steps; toggles for the order and N.
    Invariants: the view and summary are the same widgets after every change (redrawn in place),
    the slider's range is the derivation's steps, and a derivation is computed once per (order, N)."""

    def __init__(self, num_ranks: int = 2, order: str = RIGHT, tokens: int = 4, hidden: int = 8, ffn: int = 32) -> None:
        self.sizes = (tokens, hidden, ffn)
        self._cache: dict[tuple[str, int], Derivation] = {}
        for key in ORDERS:  # every choice computed up front: a shape that N does not divide fails here, not on a click
            for n in RANK_COUNTS:
                self.derivation(key, n)
        self.order = w.ToggleButtons(options=[(label, key) for key, label in ORDERS.items()], value=order,
                                     description="split", style={"button_width": "210px"})
        self.num_ranks = w.ToggleButtons(options=RANK_COUNTS, value=num_ranks, description="TP size N")
        self.slider = w.IntSlider(1, 1, 7, description="step")  # 1-based, as the heading counts
        self.back, self.forward = w.Button(description="◀ previous"), w.Button(description="next ▶")
        self.view, self.totals = w.HTML(), w.HTML()
        self.back.on_click(lambda _: setattr(self.slider, "value", max(1, self.slider.value - 1)))
        self.forward.on_click(lambda _: setattr(self.slider, "value", min(self.slider.max, self.slider.value + 1)))
        for control in (self.order, self.num_ranks, self.slider):
            control.observe(lambda _: self.redraw(), "value")
        super().__init__([self.order, self.num_ranks, w.HBox([self.back, self.forward, self.slider]), self.view,
                          self.totals])
        self.redraw()

    def derivation(self, order: str | None = None, num_ranks: int | None = None) -> Derivation:
        """The derivation for ``order`` and ``num_ranks`` (default: the toggles'), computed once."""
        key = (order or self.order.value, num_ranks or self.num_ranks.value)
        if key not in self._cache:
            self._cache[key] = derive(key[0], key[1], *self.sizes)
        return self._cache[key]

    @one_at_a_time
    def redraw(self) -> None:
        derivation = self.derivation()
        self.slider.max = len(derivation.steps)
        self.view.value = render_step(derivation, min(self.slider.value, self.slider.max) - 1)
        self.totals.value = summary(derivation, self.derivation(WRONG if self.order.value == RIGHT else RIGHT))
