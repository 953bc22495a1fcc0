// Summary statistics for latency samples (pure). Percentiles by the nearest-rank method: p99 of 300 samples is the
// 297th smallest, so it is a value that was actually measured, not an interpolation.

/** nearest-rank percentile (0 < p <= 100) of an ascending array */
export function percentile(sorted, p) {
  if (sorted.length === 0) return NaN;
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1];
}

/** { n, min, median, p99, max, mean } of the samples, rounded to `digits` decimals */
export function summarize(samples, digits = 1) {
  const s = [...samples].sort((a, b) => a - b);
  const n = s.length;
  const round = (x) => (Number.isFinite(x) ? Number(x.toFixed(digits)) : null);
  const median = n === 0 ? NaN : n % 2 === 1 ? s[n >> 1] : (s[n / 2 - 1] + s[n / 2]) / 2;
  const mean = n === 0 ? NaN : s.reduce((a, b) => a + b, 0) / n;
  return {
    n,
    min: round(s[0] ?? NaN),
    median: round(median),
    p99: round(percentile(s, 99)),
    max: round(s[n - 1] ?? NaN),
    mean: round(mean),
  };
}

/** a / b rounded to 2 decimals, null when either is missing */
export function ratio(a, b) {
  return Number.isFinite(a) && Number.isFinite(b) && b > 0 ? Number((a / b).toFixed(2)) : null;
}

/** the median of the samples (unrounded) */
export function median(samples) {
  const s = [...samples].sort((a, b) => a - b);
  const n = s.length;
  return n === 0 ? NaN : n % 2 === 1 ? s[n >> 1] : (s[n / 2 - 1] + s[n / 2]) / 2;
}
