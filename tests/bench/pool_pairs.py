"""Pools the paired-step results of several runs of tests/bench/inprocess.py --pairs (its
--json files) into one table per configuration: each mode's overhead as the median of all
pairs of all runs, the interquartile range of those pairs, each run's own median (the spread
between processes), the host CPU overhead, and, where the runs settled after each switch
(`--settle`), what the first step after resuming cost against its pair's untraced step.

    python tests/bench/pool_pairs.py [--bound MODE=PCT ...] RUN1.json RUN2.json [...]

Files of different configurations (model, batch, compiled) make a table each. With --bound,
each named mode's pooled median must be at most PCT % (`recorder` as PCT: at most the recorder
with context=None of the same runs); a line per bound says PASS or FAIL, and the exit status
is 1 when one fails."""
import json
import statistics
import sys


def key(r):
    return (r["model"], r.get("batch"), bool(r.get("compiled")), r["device"])


def main(args):
    bounds, paths = {}, []
    it = iter(args)
    for a in it:
        if a == "--bound":
            mode, _, pct = next(it).rpartition("=")
            bounds[mode] = pct
        else:
            paths.append(a)
    runs = {}
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        runs.setdefault(key(r), []).append(r)
    for (model, batch, compiled, device), rs in runs.items():
        pairs = sum(r["pairs"] for r in rs)
        title = f"{model}{' b' + str(batch) if batch else ''}{' compiled' if compiled else ''} on {device}: {len(rs)} runs, {pairs} pairs"
        settles = sorted({r.get("settle", 0) for r in rs})
        print(f"| {title} | traced step | untraced step | overhead: median of all pairs (IQR) | each run's median | host CPU overhead "
              f"| first step after resuming (settle {'/'.join(map(str, settles))}) |")
        print("|---|---|---|---|---|---|---|")
        modes = list(dict.fromkeys(m for r in rs for m in r["modes"]))
        medians = {}
        for m in modes:
            ps = [p for r in rs if m in r["modes"] for p in r["modes"][m]["pairs"]]
            step = [(t[1] / u[1] - 1) * 100 for t, u in ps]
            cpu = [(t[2] / u[2] - 1) * 100 for t, u in ps]
            q1, _, q3 = statistics.quantiles(step, n=4)
            medians[m] = statistics.median(step)
            each = ", ".join(
                f"{statistics.median((t[1] / u[1] - 1) * 100 for t, u in r['modes'][m]['pairs']):+.1f} %" for r in rs if m in r["modes"]
            )
            first = [(t[1] / u[1] - 1) * 100 for r in rs if m in r["modes"] for t, u in r["modes"][m].get("first_after_resume", [])]
            print(
                f"| {m} | {statistics.median(t[1] for t, _ in ps):.2f} ms | {statistics.median(u[1] for _, u in ps):.2f} ms "
                f"| {statistics.median(step):+.1f} % ({q1:+.1f} … {q3:+.1f}) | {each} | {statistics.median(cpu):+.1f} % "
                f"| {f'{statistics.median(first):+.1f} %' if first else '–'} |"
            )
        print()
        for m, pct in bounds.items():
            if m not in medians:
                failed.append(f"{title}: no mode {m!r}")
                continue
            limit = medians.get("recorder context=None") if pct == "recorder" else float(pct)
            ok = limit is not None and medians[m] <= limit
            print(f"{'PASS' if ok else 'FAIL'} {title}: {m} {medians[m]:+.1f} % (bound {pct if pct == 'recorder' else pct + ' %'}"
                  f"{f' = {limit:+.1f} %' if pct == 'recorder' and limit is not None else ''})")
            if not ok:
                failed.append(f"{title}: {m}")
    return 1 if failed else 0


failed = []

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
