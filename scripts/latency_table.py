"""Percentiles and markdown table rows shared by the latency scripts (first-status.py,
audit-latency.py); imported from the scripts' own folder."""


def percentile(values, p):
    """The nearest-rank percentile `p` (0–100) of `values`."""
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def row(label, values, ps=(50, 99)):
    """A table row: label, n, the percentiles `ps` and the maximum, in ms with one decimal."""
    cells = [f"{percentile(values, p):.1f}" for p in ps]
    return f"| {label} | {len(values)} | {' | '.join(cells)} | {max(values):.1f} |"
