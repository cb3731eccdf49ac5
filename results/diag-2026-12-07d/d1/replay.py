"""Replay perf's adaptive_raw.json: each path's spread of times per copy, what adaptive
staging chose, and how choosers with other estimates would have done on the same times.

python3 replay.py adaptive_raw.json [more.json ...]
"""
import json, math, statistics, sys
from collections import defaultdict

WARM, PROBE_FIRST, PROBE_MAX, WINDOW, MARGIN, DOUBLINGS = 3, 8, 1024, 8, 0.03, 3
PROBE_FLAT = WINDOW - WARM
COSTLY_RATIO, RETRY_SHARE = 2.5, 0.02


def costly_gap(ratio):
    return min(PROBE_MAX, math.ceil((ratio - 1) / RETRY_SHARE)) if ratio >= COSTLY_RATIO else 0


def est_min(w): return min(w)
def est_second(w): return sorted(w)[1] if len(w) > 1 else w[0]
def est_median(w): return statistics.median(w)
def est_lower_half(w):
    s = sorted(w); h = s[: max(1, len(s) // 2)]; return sum(h) / len(h)
def est_trim(w):
    m = min(w); k = [x for x in w if x <= 1.25 * m]; return sum(k) / len(k)

def est_third(w): return sorted(w)[min(2, len(w) - 1)]
def est_mean(w): return sum(w) / len(w)

ESTIMATES = {"min": est_min, "2nd": est_second, "3rd": est_third, "median": est_median,
             "mean": est_mean,
             "lowhalf": est_lower_half, "trim1.25": est_trim}


class Chooser:
    def __init__(self, est, costly=False):
        self.est, self.costly = est, costly; self.t = {True: [], False: []}; self.staged_wins = True
        self.until, self.stretch, self.flat = PROBE_FIRST, 2 * PROBE_FIRST, PROBE_FLAT - 1
        self.doublings, self.since = 0, None

    def warm(self): return len(self.t[True]) >= WARM and len(self.t[False]) >= WARM

    def margin(self):
        d = self.doublings - ((self.since or 0) // PROBE_MAX if self.since is not None else 0)
        return MARGIN * 2 ** max(d, 0)

    def stage(self):
        if not self.warm(): return len(self.t[True]) <= len(self.t[False])
        if self.until == 0:
            if self.flat > 0: self.flat -= 1; self.until = PROBE_FIRST
            else: self.until = self.stretch; self.stretch = min(2 * self.stretch, PROBE_MAX)
            return not self.staged_wins
        self.until -= 1; return self.staged_wins

    def learn(self, staged, secs):
        was = self.warm(); w = self.t[staged]; w.append(secs); del w[:-WINDOW]
        s, d = (self.est(self.t[k]) if self.t[k] else math.inf for k in (True, False))
        if not was:
            self.staged_wins = s <= d
            if self.costly == "early" and self.warm(): self.until = max(self.until, costly_gap(max(s, d) / min(s, d)))
            return
        self.since = 0 if self.since is None else self.since + 1
        win, oth = (s, d) if self.staged_wins else (d, s)
        retried = staged != self.staged_wins
        full = len(self.t[not self.staged_wins]) >= WINDOW or self.costly == "early"
        if oth >= win * (1 - self.margin()) and retried and self.costly and full:
            self.until = max(self.until, costly_gap(oth / win))
        if oth < win * (1 - self.margin()):
            soon = self.since < PROBE_MAX
            self.doublings = min(self.doublings + 1, DOUBLINGS) if soon else self.doublings
            self.since = 0; self.staged_wins = not self.staged_wins
            self.until, self.stretch, self.flat = PROBE_FIRST, 2 * PROBE_FIRST, PROBE_FLAT - 1


def q(xs, p):
    s = sorted(xs); return s[min(len(s) - 1, int(p * len(s)))]


def main(paths):
    runs = defaultdict(dict)
    for p in paths:
        for key, v in json.load(open(p)).items():
            # Modes may hold an underscore (bounce_nt); only the three staging modes replay.
            way, size, rest = key.split("_", 2)
            mode, rnd = rest.rsplit("_", 1)
            if mode in ("staged", "direct", "adaptive"):
                runs[(way, int(size))][(p, mode, rnd)] = v
    for (way, size), r in sorted(runs.items()):
        by = defaultdict(list)
        for (p, mode, rnd), v in r.items(): by[mode].append(v)
        st = [x for v in by["staged"] for x in v["secs"]]
        di = [x for v in by["direct"] for x in v["secs"]]
        ad = [x for v in by["adaptive"] for x in v["secs"]]
        ad_st = [x for v in by["adaptive"] for x, s in zip(v["secs"], v["staged"]) if s]
        ad_di = [x for v in by["adaptive"] for x, s in zip(v["secs"], v["staged"]) if not s]
        gb = lambda t: size / t / 1e9
        best = min(statistics.mean(st), statistics.mean(di))
        print(f"{way} {size >> 10:6d} KiB  staged  min {gb(min(st)):5.1f} p25 {gb(q(st,.25)):5.1f} med {gb(statistics.median(st)):5.1f} mean {gb(statistics.mean(st)):5.1f} GB/s (n {len(st)})")
        print(f"{'':15s} direct  min {gb(min(di)):5.1f} p25 {gb(q(di,.25)):5.1f} med {gb(statistics.median(di)):5.1f} mean {gb(statistics.mean(di)):5.1f}")
        print(f"{'':15s} adaptive med {gb(statistics.median(ad)):5.1f} mean {gb(statistics.mean(ad)):5.1f}: {len(ad_st)} staged (med {gb(statistics.median(ad_st)) if ad_st else 0:5.1f}) {len(ad_di)} direct (med {gb(statistics.median(ad_di)) if ad_di else 0:5.1f}); mean x best forced {best / statistics.mean(ad):.3f}")
        # Replay: each path's next time from its own forced series, in order, cyclic.
        line = []
        for name, est in ESTIMATES.items():
            tot, n_st, runs_n = 0.0, 0, 0
            for rot in range(0, 200, 20):
                c, i = Chooser(est), {True: rot, False: rot}
                for _ in range(1000):
                    s = c.stage(); src = st if s else di
                    t = src[i[s] % len(src)]; i[s] += 1
                    c.learn(s, t); tot += t; n_st += s; runs_n += 1
            line.append(f"{name} {best * runs_n / tot:.3f} ({n_st / runs_n:.0%} st)")
        print(f"{'':15s} replay x best: " + "  ".join(line))
        # The retry schedule, with the other path's times those of the adaptive run's
        # retries (which follow a run of the winner), 300 and 1000 copies from a fresh
        # chooser: the usual schedule, far retries of a much slower path from warming up
        # ("early", 2a6bc72) and once the slower path's window is full ("full", 9ec6a05).
        win_staged = statistics.mean(st) < statistics.mean(di)
        retry = ad_di if win_staged else ad_st
        if retry:
            out = []
            for n in (300, 1000):
                for costly in (False, "early", "full"):
                    tot = best_tot = 0.0
                    for rot in range(0, 200, 20):
                        c, i = Chooser(est_min, costly), {True: rot, False: rot}
                        for _ in range(n):
                            s_ = c.stage()
                            src = (st if s_ else retry) if win_staged else (retry if s_ else di)
                            t = src[i[s_] % len(src)]; i[s_] += 1
                            c.learn(s_, t); tot += t
                        best_tot += n * statistics.mean(st if win_staged else di)
                    out.append(f"{n} copies {costly or 'usual'} {best_tot / tot:.3f}")
            print(f"{'':15s} retries (times of the adaptive run's): " + ", ".join(out))


main(sys.argv[1:])
