"""SMQP's queue depth and Trash over time, from the broker's ``gauge`` records.

The broker reads its store's queue figures every ``--event-log-gauge`` seconds and logs a
record only when one changed, so a reading holds until the next one: the table
(brokerd.pipeline.tables.queue_gauges, from the records kept whole in the ``rare`` summary)
keeps every reading, and the plot draws each as a step held until the next.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

SERIES = (("pending", "pending (never sent)", "#1f77b4"), ("unacknowledged", "sent, not acknowledged", "#ff7f0e"),
          ("trash", "in the Trash", "#7f7f7f"))


def queue_plot(rows: list[dict[str, Any]]) -> str:
    """The PNG of :func:`queue_figure`."""
    from brokerd.pipeline.html import _png

    return _png(queue_figure(rows))


def queue_figure(rows: list[dict[str, Any]]) -> Any:
    """Pending, unacknowledged and Trash counts over time, as steps (axis from zero)."""
    from brokerd.pipeline.html import _figure, _no_data, axis_from_zero, legend_beside

    figure, axes = _figure()
    if not rows:
        _no_data(axes, "SMQP queue readings")
    else:
        times: list[datetime] = [row["time"] for row in rows]
        for name, label, colour in SERIES:
            values = [row[name] for row in rows]
            axes.step(times + [times[-1]], values + [values[-1]], where="post", label=label, color=colour, linewidth=1.4)
        axis_from_zero(axes, [row[name] for row in rows for name, _label, _colour in SERIES])
        axes.set_ylabel("messages")
        axes.set_xlabel("time (UTC)")
        legend_beside(axes)
        axes.grid(alpha=0.3)
        figure.autofmt_xdate()
    axes.set_title("SMQP queue depth and Trash")
    return figure
