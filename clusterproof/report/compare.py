"""A run against its baseline: which figures moved beyond tolerance, which checks flipped.

Why: before an upgrade an SRE wants to know what the new version changes
for the cluster's behaviour and figures, and a nightly wants to know what
changed since the last good night -- with no database (perfdash and
kube-burner's comparison both want one). Every run writes one summary
(``out/runs/<run id>/summary.json``, see ``clusterproof.report.summary``); this module compares two
of them, or a run with the median of a folder of them.

A figure regresses when it moved in its worse direction by more than its
tolerance: a relative one (``baseline_tolerance_pct``, per figure
``baseline_tolerance_overrides``) *and* an absolute one for its unit
(``baseline_min_change``), so that 0.05 s -> 0.08 s is not a "60 %"
regression. Figures without a direction (a count the profile set, say) are
shown, never judged. A check that passed in the baseline and fails now is
listed first and is a regression whatever the figures say.

Pure: reads and writes JSON, no cluster. ``clusterproof compare BASELINE
CANDIDATE [--cp-profile P]`` compares two summaries from the command line (e.g.
an existing cluster before and after its upgrade); exit 6 on a regression.
"""
from __future__ import annotations

import html
import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from clusterproof.core import exitcodes
from clusterproof.core.measurement import Figure
from clusterproof.core.texttable import text_table
from clusterproof.report.origin import commit_shown

SCHEMA = "clusterproof.summary/v1"
REGRESSION_EXIT = exitcodes.REGRESSION   # 6: the checks passed but the run regressed against its baseline
BAD = ("failed", "error", "xpassed")


class SummaryError(Exception):
    """A baseline that cannot be read: one line for the user."""


@dataclass
class Tolerance:
    pct: float = 25.0
    overrides: dict[str, float] = field(default_factory=dict)     # substring of a figure key -> pct
    min_change: dict[str, float] = field(default_factory=dict)    # unit -> smallest change that counts

    @classmethod
    def of(cls, profile) -> "Tolerance":
        return cls(profile.baseline_tolerance_pct, dict(profile.baseline_tolerance_overrides),
                   dict(profile.baseline_min_change))

    def pct_for(self, key: str) -> float:
        hits = [(len(k), v) for k, v in self.overrides.items() if k in key]
        return max(hits)[1] if hits else self.pct


@dataclass
class Row:
    key: str
    unit: str
    better: str                     # lower | higher | none
    baseline: float | None
    now: float | None
    change: float | None = None     # now - baseline
    change_pct: float | None = None
    tolerance_pct: float | None = None
    verdict: str = ""               # regressed | improved | within tolerance | new | gone | not judged


@dataclass
class Flip:
    check: str
    title: str
    baseline: str
    now: str
    reason: str = ""       # the failed or skipped side's own line (its failure message, its skip reason)

    @property
    def regressed(self) -> bool:
        return self.baseline not in BAD and self.now in BAD


@dataclass
class Comparison:
    baseline: dict          # the baseline's run facts (or "median of N runs")
    candidate: dict
    rows: list[Row]
    flips: list[Flip]

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.verdict == "regressed"]

    @property
    def flipped_to_bad(self) -> list[Flip]:
        return [f for f in self.flips if f.regressed]

    @property
    def regressed(self) -> bool:
        return bool(self.regressions or self.flipped_to_bad)

    def headline(self) -> str:
        if not self.regressed:
            return (f"no regression against the baseline ({len(self.rows)} figures, "
                    f"{sum(r.verdict == 'improved' for r in self.rows)} improved beyond tolerance)")
        parts = [f"{len(self.flipped_to_bad)} check(s) now failing"] if self.flipped_to_bad else []
        if self.regressions:
            worst = self.regressions[0]
            parts.append(f"{len(self.regressions)} figure(s) regressed beyond tolerance, first: {worst.key} "
                         f"{_num(worst.baseline)} -> {_num(worst.now)} {worst.unit} ({_pct(worst.change_pct)})")
        return "; ".join(parts)

    @classmethod
    def from_json(cls, d: dict) -> "Comparison":
        return cls(d["baseline"], d["candidate"], [Row(**r) for r in d["figures"]], [Flip(**f) for f in d["flips"]])

    def to_json(self) -> dict:
        return {"baseline": self.baseline, "candidate": self.candidate, "regressed": self.regressed,
                "headline": self.headline(), "flips": [asdict(f) for f in self.flips],
                "figures": [asdict(r) for r in self.rows]}


def _finite(v) -> float | None:
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else float(v)


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4g}"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.1f} %"


def load(path: str | Path) -> dict:
    """A summary file, or a folder of them (``*.json`` with this schema, searched recursively):
    then each figure is the median over the runs and each check's outcome is the newest run's."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*.json") if _is_summary(f))
        if not files:
            raise SummaryError(f"no clusterproof summary (*.json with schema {SCHEMA}) under {p}: pass a "
                               "summary.json of an earlier run (out/runs/<run id>/summary.json), or a folder of them")
        runs = sorted((_read(f) for f in files), key=lambda s: s.get("run", {}).get("finished", ""))
        return merge(runs)
    if not p.exists():
        raise SummaryError(f"baseline {p} does not exist: pass a summary.json of an earlier run "
                           "(out/runs/<run id>/summary.json), or a folder of them")
    return _read(p)


def _is_summary(f: Path) -> bool:
    try:
        return json.loads(f.read_text()).get("schema") == SCHEMA
    except (ValueError, OSError, AttributeError):
        return False


def _read(f: Path) -> dict:
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise SummaryError(f"cannot read baseline {f} ({e.__class__.__name__}: {e}): pass a "
                           "summary.json written by clusterproof") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise SummaryError(f"{f} is not a clusterproof summary (no \"schema\": \"{SCHEMA}\"): pass a "
                           "summary.json written by clusterproof")
    return data


def merge(runs: list[dict]) -> dict:
    """Several summaries as one baseline: each figure's median, each check's newest outcome."""
    if len(runs) == 1:
        return runs[0]
    values: dict[str, list[float]] = {}
    meta: dict[str, dict] = {}
    for s in runs:
        for key, f in s.get("figures", {}).items():
            v = _finite(f.get("value"))
            meta[key] = f
            if v is not None:
                values.setdefault(key, []).append(v)
    figures = {k: {**meta[k], "value": statistics.median(values[k]) if values.get(k) else None,
                   "runs": len(values.get(k, []))} for k in meta}
    checks = {}
    for s in runs:
        checks.update(s.get("checks", {}))
    newest = runs[-1].get("run", {})
    return {"schema": SCHEMA, "run": {**newest, "id": f"median of {len(runs)} runs",
                                      "runs": [s.get("run", {}).get("id") for s in runs]},
            "checks": checks, "figures": figures}


def figures_of(summary: dict) -> dict[str, Figure]:
    """A summary's figures by key, as typed figures (the run's own, or a baseline's median)."""
    return {key: Figure.from_json(d, key) for key, d in summary.get("figures", {}).items()}


def compare(baseline: dict, candidate: dict, tol: Tolerance) -> Comparison:
    """The candidate's figures against the baseline's (both read back as ``Figure``s), and the checks
    whose outcome changed."""
    rows = []
    base_f, now_f = figures_of(baseline), figures_of(candidate)
    for key in list(now_f) + [k for k in base_f if k not in now_f]:
        f = now_f.get(key) or base_f[key]
        b = base_f[key].value if key in base_f else None
        n = now_f[key].value if key in now_f else None
        rows.append(judge(Row(key, f.unit, f.direction, b, n), tol))
    order = {"regressed": 0, "improved": 1, "within tolerance": 2, "not judged": 3, "new": 4, "gone": 5}
    rows.sort(key=lambda r: (order[r.verdict], -abs(r.change_pct or 0)))
    flips = []
    base_c, now_c = baseline.get("checks", {}), candidate.get("checks", {})
    for check in sorted(set(base_c) | set(now_c)):
        b, n = base_c.get(check, {}), now_c.get(check, {})
        if b.get("outcome") != n.get("outcome"):
            flips.append(Flip(check, n.get("title") or b.get("title") or check,
                              b.get("outcome", "absent"), n.get("outcome", "absent"),
                              n.get("message") or b.get("message") or ""))
    flips.sort(key=lambda f: (not f.regressed, f.check))
    return Comparison(baseline.get("run", {}), candidate.get("run", {}), rows, flips)


def judge(r: Row, tol: Tolerance) -> Row:
    if r.baseline is None and r.now is None:
        r.verdict = "not judged"
        return r
    if r.baseline is None:
        r.verdict = "new"
        return r
    if r.now is None:
        r.verdict = "gone"
        return r
    r.change = r.now - r.baseline
    r.change_pct = 100.0 * r.change / abs(r.baseline) if r.baseline else (0.0 if not r.change else math.copysign(
        math.inf, r.change))
    if r.better not in ("lower", "higher"):
        r.verdict = "not judged"
        return r
    r.tolerance_pct = tol.pct_for(r.key)
    worse = r.change > 0 if r.better == "lower" else r.change < 0
    beyond = abs(r.change_pct) > r.tolerance_pct and abs(r.change) > tol.min_change.get(r.unit, 0.0)
    r.verdict = ("regressed" if worse else "improved") if beyond else "within tolerance"
    if r.change_pct is not None and math.isinf(r.change_pct):
        r.change_pct = None   # from zero: no percentage, the absolute change says it
    return r


def short_key(key: str, width: int) -> str:
    """A figure's key in ``width`` characters: the module's path and the middle of the test's name go
    first, the figure's own name (after " :: ") and the test's parameters last."""
    k = key.removeprefix("suites/").replace(".py::", "::", 1)
    if len(k) <= width:
        return k
    head, sep, name = k.rpartition(" :: ")
    room = width - len(sep) - len(name) - 3
    if not sep:
        return k[:width - 3] + "..."
    if room < 12:   # a long figure name says more than a few letters of its test
        return name if len(name) <= width else name[:width - 3] + "..."
    front = room // 2
    return head[:front] + "..." + head[len(head) - (room - front):] + sep + name


def described(run: dict) -> str:
    """A summary's run in one phrase: 'night-2 (v1.35.4, profile smoke, commit a1b2c3d4e5f6)' -- the
    commit is what ``git log <baseline's commit>..HEAD`` needs (docs/triage.md); a summary from before
    clusterproof recorded it names none."""
    commit = run.get("commit")
    return (f"{run.get('id', '?')} ({run.get('kubernetes', '?')}, profile {run.get('profile', '?')}"
            + (f", commit {commit_shown(commit, run.get('dirty'))}" if commit else "") + ")")


def text_report(c: Comparison, limit: int | None = None) -> str:
    """The comparison for a terminal or a ticket: flips first, then figures, worst first."""
    out = [f"baseline: {described(c.baseline)}   now: {described(c.candidate)}"]
    if c.flips:
        out.append("checks that flipped:")
        out.append(text_table((), [[f.baseline, f"-> {f.now}", f.title + (f" ({f.reason[:160]})" if f.reason else "")]
                                   for f in c.flips], ">", indent="  "))
    rows = [r for r in c.rows if r.verdict in ("regressed", "improved")] if limit else c.rows
    w = min(max([len(short_key(r.key, 10**6)) for r in rows] + [6]), 90)
    out.append(text_table(["figure", "baseline", "now", "unit", "change", "tol", "verdict"],
                          [[short_key(r.key, w), _num(r.baseline), _num(r.now), r.unit[:8], _pct(r.change_pct),
                            "" if r.tolerance_pct is None else f"{r.tolerance_pct:g}%", r.verdict]
                           for r in rows[:limit]], "<>><>>"))
    if limit and len(rows) > limit:
        out.append(f"... {len(rows) - limit} more in comparison.json (beside the run's summary.json)")
    out.append(("REGRESSED: " if c.regressed else "OK: ") + c.headline())
    return "\n".join(out)


def html_report(c: Comparison) -> str:
    e = html.escape
    colour = {"regressed": "#c62828", "improved": "#2e7d32", "new": "#1565c0", "gone": "#6a1b9a"}
    parts = ["<html><body style='font-family:sans-serif;font-size:13px'>",
             f"<p><b>{'Regressed' if c.regressed else 'No regression'}</b>: {e(c.headline())}</p>",
             f"<p>Baseline: {e(described(c.baseline))}. Now: {e(described(c.candidate))}.</p>"]
    if c.flips:
        parts.append("<h4>Checks that flipped</h4><table border=1 cellpadding=3 style='border-collapse:collapse'>"
                     "<tr><th>check</th><th>baseline</th><th>now</th><th>why</th></tr>")
        parts += [f"<tr><td>{e(f.title)}</td><td>{e(f.baseline)}</td><td style='color:"
                  f"{'#c62828' if f.regressed else '#2e7d32'}'>{e(f.now)}</td><td>{e(f.reason)}</td></tr>"
                  for f in c.flips]
        parts.append("</table>")
    parts.append("<h4>Figures</h4><table border=1 cellpadding=3 style='border-collapse:collapse'><tr><th>figure"
                 "</th><th>unit</th><th>better</th><th>baseline</th><th>now</th><th>change</th><th>tolerance</th>"
                 "<th>verdict</th></tr>")
    for r in c.rows:
        tol = "" if r.tolerance_pct is None else f"{r.tolerance_pct:g} %"
        parts.append(f"<tr><td>{e(r.key)}</td><td>{e(r.unit)}</td><td>{e(r.better)}</td>"
                     f"<td align=right>{_num(r.baseline)}</td><td align=right>{_num(r.now)}</td>"
                     f"<td align=right>{_pct(r.change_pct)}</td><td align=right>{tol}</td>"
                     f"<td style='color:{colour.get(r.verdict, '#000')}'>{e(r.verdict)}</td></tr>")
    parts.append("</table></body></html>")
    return "".join(parts)
