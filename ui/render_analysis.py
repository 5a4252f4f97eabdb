"""HTML of the analysis tabs: the failure cases, the offline negatives and the metrics tables,
each saying which split, rule and seeds its numbers come from. Pure functions, as ``render``."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from aoq_serve.schemas import FailuresOut, MetricsOut, ModelOut, NegativeItem, NegativesOut
from aoq_ui.render import DOT, RULES, SCOPE_LABELS, TICK, format_rank, measured_label, render_notice
from aoq_ui.seeds import SeedSummary

WHICH_LABELS = {
    "baseline_only": "left (baseline) wrong at rank 1, right (AOQ) right",
    "aoq_only": "right (AOQ) wrong at rank 1, left (baseline) right",
    "both": "both wrong at rank 1",
}
DIRECTION_LABELS = {"t2i": "text \u2192 image", "i2t": "image \u2192 text"}
_TABLE_COLUMNS = {"r1": "R@1", "r5": "R@5", "r10": "R@10", "medr": "medr", "meanr": "meanr"}


def _label(item_text: str | None, name: str | None, query_id: int) -> str:
    return item_text or name or f"query {query_id}"


def failure_choices(failures: FailuresOut) -> list[tuple[str, int]]:
    """Dropdown entries (label, query id) for the listed failure cases."""
    choices = []
    for number, item in enumerate(failures.items, start=failures.offset + 1):
        what = _label(item.query_text, item.image_name, item.query_id)
        short = what if len(what) <= 70 else what[:67] + "..."
        copies = f" \u00d7{item.copies}" if item.copies > 1 else ""
        choices.append((f"{number}. {short}{copies}  [{failures.left}: rank {format_rank(item.left_rank)}, "
                        f"{failures.right}: rank {format_rank(item.right_rank)}]", item.query_id))
    return choices


def render_failures(failures: FailuresOut) -> str:
    """How many cases of the asked kind exist, which page is listed, the rule the ranks follow,
    and the listed cases with their pictures."""
    kind = WHICH_LABELS.get(failures.which, failures.which)
    direction = DIRECTION_LABELS.get(failures.direction, failures.direction)
    shown = (f"cases {failures.offset + 1}\u2013{failures.offset + len(failures.items)} of <b>{failures.total:,}</b>"
             if failures.items else f"none of <b>{failures.total:,}</b> on this page")
    if failures.queries is not None and failures.queries != failures.total:
        shown += (f" ({failures.queries:,} queries: \u00d7n marks a text that is the caption of n pictures, "
                  "such as both vendors' drawings, with the same two ranks)")
    origin = ""
    if failures.measured is not None:
        origin = (f" Ranks of the {escape(measured_label(failures.measured))}: "
                  f"{escape(RULES[failures.measured.positives])}.")
    summary = (f'<div class="aoq-meta">{direction}, {escape(kind)} (left = {escape(failures.left)}, '
               f"right = {escape(failures.right)}): {shown}.{origin} Pick one below to see both rankings; it opens "
               f"in the scope they were evaluated in ({escape(SCOPE_LABELS[failures.scope])}, raw scores), "
               "whatever the scope above says.</div>")
    if not failures.items:
        return summary
    t2i = failures.direction == "t2i"
    head = ["#", "query caption", "its picture"] if t2i else ["#", "query image", "its name"]
    head += [f"rank, {failures.left}", f"rank, {failures.right}"]
    rows = []
    for number, item in enumerate(failures.items, start=failures.offset + 1):
        name = escape(item.image_name or "")
        image = f'<img src="{escape(item.thumbnail_url)}" alt="{name}" title="{name}">' if item.thumbnail_url else ""
        copies = f' <span class="aoq-rank">\u00d7{item.copies}</span>' if item.copies > 1 else ""
        cells = [str(number), escape(item.query_text or "") + copies, image] if t2i else [str(number), image, name]
        cells += [format_rank(item.left_rank), format_rank(item.right_rank)]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    header = "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"
    return summary + f'<table class="aoq-table aoq-failures">{header}' + "".join(rows) + "</table>"


def _negative_item(item: NegativeItem, kind: str) -> str:
    badge = f"mined #{item.rank}" if item.rank is not None else f"score {item.score:.3f}" if item.score is not None \
        else ""
    badge_html = f'<span class="aoq-rank">{badge}</span> ' if badge else ""
    text = escape(item.text or "")
    picture = f'<img src="{escape(item.image_url)}" alt="{text}" title="{text}">' if item.image_url else ""
    removed = "" if item.removed_by is None else " aoq-removed"
    why = "" if item.removed_by is None else \
        f' <span class="aoq-why" title="not among the negatives round 2 samples from">removed: {item.removed_by}</span>'
    if item.correct:  # the same caption text as the anchor: a correct match, not a negative
        why += f' <span class="aoq-tick" title="shares a caption text with the anchor">{TICK} correct match</span>'
    if kind == "image":
        return (f'<figure class="aoq-card{removed}" data-id="{item.id}">{picture}<figcaption class="aoq-caption">'
                f'{badge_html}{why}<span class="aoq-name">{text}</span></figcaption></figure>')
    li_class = f' class="{removed.strip()}"' if removed else ""
    return f'<li{li_class} data-id="{item.id}">{picture}<span>{badge_html}<span class="aoq-text">{text}</span>{why}' \
           '</span></li>'


def _negative_block(title: str, items: Sequence[NegativeItem], kind: str) -> str:
    if not items:
        inner = render_notice("none")
    elif kind == "image":
        inner = '<div class="aoq-grid">' + "".join(_negative_item(i, kind) for i in items) + "</div>"
    else:
        inner = '<ol class="aoq-list">' + "".join(_negative_item(i, kind) for i in items) + "</ol>"
    return f'<div class="aoq-col"><h4>{escape(title)}</h4>{inner}</div>'


def render_negatives(answer: NegativesOut) -> tuple[str, str, str]:
    """(anchor, offline column, online column) for the offline-negatives tab (paper Fig. 3).

    A caption anchor has image negatives and an image anchor has caption negatives; every item
    shows its text (an image's name) and its picture (a caption's image).
    """
    text = escape(answer.text or "")
    picture = f'<img class="aoq-queryimg" src="{escape(answer.image_url)}" alt="{text}" title="{text}">' \
        if answer.image_url else ""
    if answer.kind == "caption":
        anchor = f'<div class="aoq-query">Anchor: training caption {answer.id}, <q>{text}</q><br>{picture}</div>'
        negative_kind = "image"
    else:
        anchor = f'<div class="aoq-query">Anchor: training image {answer.id}, <b>{text}</b><br>{picture}</div>'
        negative_kind = "caption"
    filtered = "; mined without false-negative filters" if not answer.filters else \
        f"; struck through: removed as a likely false negative (filter{'s' if len(answer.filters) > 1 else ''}: " \
        f"{', '.join(answer.filters)})"
    if any(item.correct for item in (*answer.offline, *answer.online)):
        filtered += f"; {TICK}: a correct match (same caption text as the anchor), not a negative"
    offline = _negative_block("Offline hard negatives (mined from the whole training set; rank in the mined list"
                              f"{filtered})", answer.offline, negative_kind)
    online = _negative_block("Online hard negatives (hardest in a random batch of 128; the model's score)",
                             answer.online, negative_kind)
    return anchor, offline, online


def render_metrics_table(all_metrics: Sequence[MetricsOut]) -> str:
    """The R@K table of every model under every protocol it was evaluated with, each row saying
    the split, rule and seed it was measured on."""
    head = "".join(f"<th>{d} {label}</th>" for d in ("i2t", "t2i") for label in _TABLE_COLUMNS.values())
    rows = []
    for metrics in all_metrics:
        origin = escape(measured_label(metrics.measured))
        if not metrics.tables:
            rows.append(f"<tr><td>{escape(metrics.model)}</td><td colspan=\"13\">not evaluated</td></tr>")
        for protocol, table in metrics.tables.items():
            cells = "".join(f"<td>{getattr(getattr(table, d), c):.1f}</td>"
                            for d in ("i2t", "t2i") for c in _TABLE_COLUMNS)
            rows.append(f"<tr><td>{escape(metrics.model)}</td><td>{origin}</td><td>{escape(protocol)}</td>{cells}"
                        f"<td>{table.rsum:.1f}</td></tr>")
    rules = {m.measured.positives for m in all_metrics if m.measured is not None}
    explained = "".join(f'<div class="aoq-meta">Positives rule {r}: {escape(RULES[r])}.</div>' for r in sorted(rules))
    table = (f'<table class="aoq-table aoq-metrics"><tr><th>model</th><th>measured on</th><th>protocol</th>{head}'
             f"<th>rsum</th></tr>" + "".join(rows) + "</table>")
    return (f'<div class="aoq-meta">Recall at K (%), median and mean rank of the evaluation split; rsum = the six '
            f"recalls summed. One served checkpoint is one training seed.</div>{explained}{table}"
            + render_label_table(all_metrics))


def render_selection(models: Sequence[ModelOut], names: Sequence[str]) -> str:
    """The dev figure each checkpoint was selected on (``/models`` metrics), labelled."""
    lines = []
    for model in models:
        if model.name in names and "rsum" in model.metrics:
            lines.append(f"{escape(model.name)}: rsum {model.metrics['rsum']:.1f} "
                         f"({escape(measured_label(model.metrics_measured))})")
    if not lines:
        return ""
    return f'<div class="aoq-meta">Checkpoints were selected on: {DOT.join(lines)}.</div>'


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def render_label_table(all_metrics: Sequence[MetricsOut]) -> str:
    """mAP@R and NDCG@k of the models whose gallery has labels; empty when none has."""
    rows = [
        f"<tr><td>{escape(m.model)}</td><td>{m.labels.n_labels}</td>"
        + "".join(f"<td>{_percent(getattr(getattr(m.labels, d), c))}</td>"
                  for d in ("i2t", "t2i") for c in ("map_at_r", "ndcg"))
        + f"<td>{m.labels.k}</td></tr>"
        for m in all_metrics
        if m.labels is not None
    ]
    if not rows:
        return ""
    head = "".join(f"<th>{d} {c}</th>" for d in ("i2t", "t2i") for c in ("mAP@R", "NDCG@k"))
    return ('<p>Label-wise retrieval (relevance = shared labels, percent; same split as above)</p>'
            f'<table class="aoq-table aoq-labels"><tr><th>model</th><th>labels</th>{head}<th>k</th></tr>'
            + "".join(rows) + "</table>")


def _signed(value: float) -> str:
    """A difference with its sign, the minus as the typographic one the page's text uses."""
    return f"{value:+.1f}".replace("-", "\u2212")


def render_seed_note(summary: SeedSummary | None, all_metrics: Sequence[MetricsOut], models: Sequence[ModelOut]
                     ) -> str:
    """The served baseline and AOQ (one seed each) beside the pair's multi-seed result: AOQ -
    baseline with its paired interval and n, and how far single seeds fall from the mean."""
    if summary is None:
        return ""
    roles = {m.name: m.role for m in models}
    served = {roles.get(m.model): m for m in all_metrics if "full" in m.tables and m.measured is not None}
    lines = [f"Over {len(summary.per_seed)} seeds ({escape(summary.source)}): baseline rsum "
             f"{escape(summary.baseline_rsum)}, AOQ {escape(summary.aoq_rsum)}; AOQ \u2212 baseline "
             f"{escape(summary.difference)}, a paired 95% interval over the seeds."]
    if "baseline" in served and "aoq" in served:
        baseline, aoq = served["baseline"], served["aoq"]
        seeds = sorted(set(baseline.measured.seeds) | set(aoq.measured.seeds))
        gap = aoq.tables["full"].rsum - baseline.tables["full"].rsum
        lines.insert(0, f"The demo serves one seed ({', '.join(map(str, seeds)) or 'not recorded'}): baseline rsum "
                        f"{baseline.tables['full'].rsum:.1f}, AOQ {aoq.tables['full'].rsum:.1f}, AOQ \u2212 baseline "
                        f"{_signed(gap)}.")
    gaps = [a - b for b, a in summary.per_seed.values()]
    if gaps:
        lines.append(f"One seed can be far from the mean: per seed, AOQ \u2212 baseline ran from {_signed(min(gaps))} to "
                     f"{_signed(max(gaps))}, and a model trained from the same seed on another CPU can differ too.")
    return '<div class="aoq-seeds">' + " ".join(lines) + "</div>"
