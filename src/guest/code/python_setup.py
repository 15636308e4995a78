# Run silently in every new Python context (server.py): a matplotlib figure shown in a cell also
# carries its data as `e2b/chart` (E2B's `result.chart`), read from the figure's artists. matplotlib
# is not imported here: only a figure a cell shows is read.
def _collimate_register_chart():
    import sys
    import types

    import IPython

    ip = IPython.get_ipython()
    if ip is None:
        return

    def num(v):
        try:
            return float(v)
        except (TypeError, ValueError):
            return str(v)

    def label_of(artist):
        label = artist.get_label()
        return "" if label.startswith("_") else label

    def chart(fig):
        axes = [a for a in fig.get_axes() if a.get_visible()]
        if not axes:
            return None
        if len(axes) == 1:
            return axes_chart(axes[0])
        title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else None
        return {"type": "superchart", "title": title, "elements": [c for c in (axes_chart(a) for a in axes) if c]}

    def axes_chart(ax):
        from matplotlib.collections import PathCollection
        from matplotlib.patches import Rectangle, Wedge

        base = {"title": ax.get_title() or None, "x_label": ax.get_xlabel() or None, "y_label": ax.get_ylabel() or None}
        wedges = [p for p in ax.patches if isinstance(p, Wedge)]
        if wedges:
            texts = [t.get_text() for t in ax.texts]
            return {**base, "type": "pie", "elements": [
                {"label": texts[i] if i < len(texts) else str(i), "angle": num(w.theta2 - w.theta1), "radius": num(w.r)}
                for i, w in enumerate(wedges)]}
        bars = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_width() > 0 and p.get_height() != 0]
        if bars:
            ticks = list(ax.get_xticks())
            labels = [t.get_text() for t in ax.get_xticklabels()]
            elements = []
            for b in bars:
                x = b.get_x() + b.get_width() / 2
                near = [i for i, t in enumerate(ticks) if i < len(labels) and abs(t - x) < b.get_width() / 2]
                label = labels[near[0]] if near else str(round(x, 6))
                elements.append({"label": label, "value": num(b.get_height()), "group": label_of(b)})
            return {**base, "type": "bar", "elements": elements}
        scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
        if scatters:
            return {**base, "type": "scatter", "elements": [
                {"label": label_of(c), "points": [[num(x), num(y)] for x, y in c.get_offsets()]} for c in scatters]}
        lines = [line for line in ax.get_lines() if line.get_visible()]
        if lines:
            return {**base, "type": "line", "elements": [
                {"label": label_of(line), "points": [[num(x), num(y)] for x, y in zip(line.get_xdata(), line.get_ydata())]}
                for line in lines]}
        return {**base, "type": "unknown", "elements": []}

    def safe_chart(fig):
        try:
            return chart(fig)
        except Exception:  # noqa: BLE001 - a figure we cannot read still shows as its image
            return None

    # A wrapper of the display formatter rather than a printer registered for Figure: matplotlib's
    # inline backend drops every Figure printer when pyplot is set up, in the cell that imports it.
    formatter = ip.display_formatter
    plain_format = formatter.format

    def format_with_chart(obj, include=None, exclude=None):
        data, metadata = plain_format(obj, include=include, exclude=exclude)
        kind = type(obj)
        if kind.__name__ == "Figure" and kind.__module__ == "matplotlib.figure" and (include is None or "e2b/chart" in include):
            found = safe_chart(obj)
            if found is not None:
                data["e2b/chart"] = found
        return data, metadata

    formatter.format = format_with_chart

    helpers = types.ModuleType("_collimate")
    helpers.chart = chart
    sys.modules["_collimate"] = helpers


_collimate_register_chart()
del _collimate_register_chart
