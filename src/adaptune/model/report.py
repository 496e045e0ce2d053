"""``adaptune report``: PNG plots and one HTML page for a model work dir.

Everything is read back from the work dir (``model.json`` and the per-task knob-vector logs), so
a report can be written for a run that is still going or was interrupted.
"""
from __future__ import annotations

import html
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..measure.run import latency  # noqa: E402
from ..measure.workdir import WorkDir  # noqa: E402


def load_run(work_dir) -> tuple[dict, dict[str, list[dict]]]:
    """``model.json`` and, per task, its records in measurement order."""
    wd = WorkDir(work_dir)
    meta = wd.model()
    return meta, {t["name"]: wd.records(t["name"]) for t in meta["tasks"]}


def _latency(row) -> float | None:
    secs = row.get("run_secs") or []
    return latency(secs) if row.get("error") == "ok" and secs else None


def _running_best(rows) -> list[float | None]:
    best, out = None, []
    for r in rows:
        lat = _latency(r)
        if lat is not None and (best is None or lat < best):
            best = lat
        out.append(best)
    return out


def task_table(meta, records) -> list[dict]:
    out = []
    for t in meta["tasks"]:
        rows = records[t["name"]]
        best = _running_best(rows)[-1] if rows else None
        current = min(x for x in (best, t["baseline"]) if x is not None) if (best or t["baseline"]) else None
        out.append({**t, "trials": len(rows), "best": best, "current": current,
                    "failed": sum(1 for r in rows if r.get("error") != "ok"),
                    "speedup": (t["baseline"] / current) if t["baseline"] and current else None})
    return out


def _plot_convergence(meta, records, path: Path) -> None:
    tasks = [t for t in meta["tasks"] if records[t["name"]]]
    n = max(1, len(tasks))
    cols = min(4, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.6 * rows), squeeze=False)
    for ax, t in zip(axes.flat, tasks):
        best = _running_best(records[t["name"]])
        xs = [i + 1 for i, b in enumerate(best) if b is not None]
        if t["flops"] > 0:
            ax.plot(xs, [t["flops"] / b / 1e9 for b in best if b is not None], marker=".")
            ax.set_ylabel("best GFLOPS")
            if t["baseline"]:
                ax.axhline(t["flops"] / t["baseline"] / 1e9, color="grey", ls="--", lw=1, label="untuned")
        else:
            ax.plot(xs, [b * 1e3 for b in best if b is not None], marker=".")
            ax.set_ylabel("best ms")
        ax.set_title(f"{t['name'][:34]} (x{t['weight']})", fontsize=8)
        ax.set_xlabel("measurements")
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    fig.suptitle("Convergence per task (dashed: untuned kernel)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _plot_model(meta, records, path: Path) -> None:
    """Estimated model kernel time (sum of weight x best-so-far) against total measurements."""
    current = {t["name"]: t["baseline"] or 0.0 for t in meta["tasks"]}
    weight = {t["name"]: t["weight"] for t in meta["tasks"]}
    events = sorted((r.get("time", 0.0), name, _latency(r)) for name, rows in records.items() for r in rows)
    ys = []
    for _, name, lat in events:
        if lat is not None and lat < current[name]:
            current[name] = lat
        ys.append(sum(weight[k] * v for k, v in current.items()) * 1e3)
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.plot(range(1, len(ys) + 1), ys)
    ax.set_yscale("log")
    ax.set_xlabel("measurements (all tasks)")
    ax.set_ylabel("model kernel time, ms")
    ax.set_title("Whole model: sum over tasks of weight x best kernel")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _plot_bars(table, key: str, xlabel: str, path: Path, log: bool = False) -> None:
    rows = [r for r in table if r[key] is not None]
    fig, ax = plt.subplots(figsize=(6.5, 0.3 * len(rows) + 1.2))
    ax.barh([r["name"][:40] for r in rows], [r[key] for r in rows])
    if log:
        ax.set_xscale("log")
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel(xlabel)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _ms(sec) -> str:
    return "-" if sec is None else f"{sec * 1e3:.4f}"


def _x(ratio) -> str:
    return "-" if ratio is None else f"{ratio:.1f}x"


def _library_table(choices) -> str:
    """The per-operator library choice (written by ``tune``/``bench``) as an HTML section."""
    if not choices:
        return ""
    esc = html.escape
    rows = "".join(
        f"<tr><td>{esc(c['op'])}</td><td>{c['calls']}</td><td>{_opt_ms(c['library_ms'])}</td>"
        f"<td>{_opt_ms(c.get('winograd_ms'))}</td><td>{_opt_ms(c.get('winograd_generated_ms'))}</td>"
        f"<td>{_opt_ms(c.get('winograd2_generated_ms'))}</td>"
        f"<td>{_opt_ms(c['generated_ms']) if c.get('own_kernel', True) else 'in a larger kernel'}</td>"
        f"<td>{esc(c['choice'])}</td></tr>" for c in choices)
    return ("<h2>Per chain: the library's fused call, Winograd or our tuned kernel</h2><table><tr><th>chain</th>"
            f"<th>calls</th><th>library ms</th><th>Winograd ms</th><th>Winograd, generated GEMMs, ms</th>"
            f"<th>F(2x2), generated GEMMs, ms</th>"
            f"<th>tuned (fused) ms</th><th>fastest</th></tr>"
            f"{rows}</table>")


def _opt_ms(ms) -> str:
    return "-" if ms is None else f"{ms:.3f}"


def write_report(work_dir, out_dir=None) -> Path:
    """Write the PNGs and ``index.html`` to ``out_dir`` (default ``WORK_DIR/report``); returns the page."""
    meta, records = load_run(work_dir)
    out = Path(out_dir) if out_dir else Path(work_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    table = task_table(meta, records)
    _plot_convergence(meta, records, out / "convergence.png")
    _plot_model(meta, records, out / "model_convergence.png")
    _plot_bars(table, "speedup", "speedup of the kernel over untuned TVM (log)", out / "speedup.png", log=True)
    _plot_bars(table, "trials", "measurements spent", out / "trials.png")
    esc = html.escape
    total = sum(r["trials"] for r in table)
    est0 = sum(r["weight"] * (r["baseline"] or 0) for r in table)
    est1 = sum(r["weight"] * (r["current"] or 0) for r in table)
    comp = meta.get("compiled")
    summary = [("model", meta["model"]), ("target", meta["target"]), ("strategy", meta["strategy"]),
               ("measurements", f"{total} of a budget of {meta['trials']}"),
               ("kernel time, untuned -> tuned (sum of weight x kernel)", f"{_ms(est0)} ms -> {_ms(est1)} ms")]
    if comp:
        summary.append(("compiled model, untuned -> tuned (checked numerically)",
                        f"{_ms(comp['untuned_s'])} ms -> {_ms(comp['tuned_s'])} ms "
                        f"({comp['untuned_s'] / comp['tuned_s']:.1f}x; max error {comp['max_rel_error']:.1e})"))
        if comp.get("final_s") and comp.get("final_build") != "generated":
            summary.append((f"final model ({comp['final_build']} build: library calls where faster)",
                            f"{_ms(comp['final_s'])} ms ({comp['untuned_s'] / comp['final_s']:.1f}x)"))
    library_html = _library_table(meta.get("library") or [])
    p = meta.get("passes", {})
    ops = sorted(set(p.get("before", {})) | set(p.get("after", {})))
    task_rows = "".join(
        f"<tr><td>{esc(r['name'])}</td><td>{r['weight']}</td><td>{r['flops'] / 1e6:.1f}</td><td>{r['trials']}</td>"
        f"<td>{r['failed']}</td><td>{_ms(r['baseline'])}</td><td>{_ms(r['current'])}</td>"
        f"<td>{_x(r['speedup'])}</td></tr>"
        for r in table)
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>adaptune report: {esc(meta['name'])}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}} table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}} td:first-child,th:first-child{{text-align:left}}
img{{max-width:100%;border:1px solid #eee;margin:0.5em 0}}</style></head>
<body>
<h1>adaptune report: {esc(meta['name'])}</h1>
<table>{''.join(f'<tr><th>{esc(k)}</th><td>{esc(str(v))}</td></tr>' for k, v in summary)}</table>
<h2>Graph passes</h2>
<p>{esc(' → '.join(p.get('passes', [])))}: {p.get('ops_before', '?')} operator calls → {p.get('ops_after', '?')}
after folding → {p.get('kernel_calls', '?')} fused kernel calls in {p.get('tasks', '?')} distinct tasks.</p>
<table><tr><th>operator</th><th>before</th><th>after</th></tr>
{''.join(f"<tr><td>{esc(o)}</td><td>{p['before'].get(o, 0)}</td><td>{p['after'].get(o, 0)}</td></tr>" for o in ops)}
</table>
{library_html}
<h2>Whole model</h2><img src="model_convergence.png" alt="model convergence">
<h2>Tasks</h2>
<table><tr><th>task</th><th>weight</th><th>MFLOP</th><th>trials</th><th>failed</th><th>untuned ms</th>
<th>tuned ms</th><th>speedup</th></tr>{task_rows}</table>
<img src="speedup.png" alt="per-task speedup"><img src="trials.png" alt="measurements per task">
<h2>Convergence per task</h2><img src="convergence.png" alt="convergence per task">
</body></html>
"""
    page_path = out / "index.html"
    tmp = page_path.with_suffix(".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(page_path)
    return page_path
