//! The statistics every result table uses: one percentile definition (the ceil(q n)-th
//! smallest, as the TDR's and the thesis's tables) and one median.

/// The `q`-quantile of sorted values: the ceil(q n)-th smallest (q = 0 gives the
/// smallest, 1 the largest); None when there are none.
pub fn percentile<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
    Some(sorted[i])
}

/// The median of sorted values: the middle one, or the mean of the middle two.
pub fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_ranks() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), Some(50));
        assert_eq!(percentile(&v, 0.99), Some(99));
        assert_eq!(percentile(&v, 1.0), Some(100));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile::<u32>(&[], 0.5), None);
    }

    #[test]
    fn medians_average_the_middle_pair() {
        assert_eq!(median(&[1.0, 2.0, 4.0]), 2.0);
        assert_eq!(median(&[1.0, 2.0, 4.0, 8.0]), 3.0);
        assert!(median(&[]).is_nan());
    }
}
