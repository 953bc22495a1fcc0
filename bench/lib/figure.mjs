// One figure of `npm run bench`: ours and the same-run baseline as median / p90 / p99, and their ratios. A bench
// prints each figure as one JSON line with "figure" set; bench/run.mjs collects them into the table (or --json).
import { percentile, median } from './stats.mjs';

const round = (x, d = 2) => (Number.isFinite(x) ? Number(x.toFixed(d)) : null);

/** { n, median, p90, p99 } of the samples (nearest-rank percentiles) */
export function dist(samples) {
  const s = [...samples].sort((a, b) => a - b);
  return {
    n: s.length,
    median: round(median(s), 3),
    p90: round(percentile(s, 90), 3),
    p99: round(percentile(s, 99), 3),
  };
}

/**
 * Prints and returns the figure line. ours/baseline: samples (arrays) in `unit`; goal: the bound on the
 * median ratio (and goalP99 on the p99 ratio, where the issue sets one); extra: anything else worth keeping.
 */
export function figure(name, unit, ours, baseline, { goal, goalP99, what, baselineWhat, extra } = {}) {
  const o = dist(ours);
  const b = dist(baseline);
  const ratio = { median: round(o.median / b.median), p90: round(o.p90 / b.p90), p99: round(o.p99 / b.p99) };
  const line = {
    figure: name,
    unit,
    what,
    baselineWhat,
    ours: o,
    baseline: b,
    ratio,
    goal: goal ?? null,
    goalP99: goalP99 ?? null,
    ...(extra ? { extra } : {}),
  };
  console.log(JSON.stringify(line));
  return line;
}

/** A figure without a baseline (memory, counts): printed the same way, ratio null. */
export function measure(name, unit, value, extra) {
  const line = { figure: name, unit, value, ...(extra ? { extra } : {}) };
  console.log(JSON.stringify(line));
  return line;
}
