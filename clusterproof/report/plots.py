"""Plots for the report: matplotlib (Agg), titled, labelled axes with units, a legend -- and the data.

Why a module: every plot an SRE reads the next morning must say what it
shows without the log: a title, both axes with their units, a legend for
each series and each threshold. Every plot is attached together with the
numbers it was drawn from (CSV), so a reader can check or re-plot them.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

import allure


def _pyplot():
    """matplotlib's pyplot on the Agg backend (no display: the harness runs headless, in CI), imported at
    the first plot, not with this module: it is half a second of CPU at every run's start, and most runs
    (a bad input's one line, the self-tests' hundreds of child runs) draw nothing."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]
    style: str = "scatter"          # "scatter" | "line"


@dataclass
class Plot:
    title: str
    xlabel: str                     # with its unit, e.g. "time since the first create (s)"
    ylabel: str
    series: list[Series] = field(default_factory=list)
    thresholds: dict[str, float] = field(default_factory=dict)   # legend label -> y
    xlog: bool = False
    ylog: bool = False

    def png(self) -> bytes:
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
        for s in self.series:
            xs, ys = [p[0] for p in s.points], [p[1] for p in s.points]
            if s.style == "line":
                ax.plot(xs, ys, marker="o", label=s.label)
            else:
                ax.scatter(xs, ys, s=6, alpha=0.6, label=s.label)
        styles = [("red", "--"), ("purple", ":"), ("black", "-.")]
        for (label, y), (color, dash) in zip(self.thresholds.items(), styles * 3):
            ax.axhline(y, color=color, linestyle=dash, linewidth=1.4, label=label)
        ax.set_title(self.title)
        ax.set_xlabel(self.xlabel)
        ax.set_ylabel(self.ylabel)
        if self.xlog:
            ax.set_xscale("log")
        if self.ylog:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        if self.series or self.thresholds:
            ax.legend(loc="best", fontsize="small")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        plt.close(fig)
        return buf.getvalue()

    def csv(self) -> str:
        """The data behind the plot: one row per point, with its series."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["series", self.xlabel, self.ylabel])
        for s in self.series:
            w.writerows([s.label, x, y] for x, y in s.points)
        for label, y in self.thresholds.items():
            w.writerow([label, "", y])
        return buf.getvalue()

    def attach(self) -> None:
        """The plot and its data, side by side in the report."""
        allure.attach(self.png(), self.title, allure.attachment_type.PNG)
        allure.attach(self.csv(), f"{self.title} (data)", allure.attachment_type.CSV)
