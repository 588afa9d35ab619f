//! The table the examples print for the seed scenario: per bucket layout,
//! the send times and what a strict server with the seed quota (burst 3,
//! 2 per second) answers.

use crate::strict_server::StrictServer;

/// How a send time is written.
#[derive(Debug, Clone, Copy)]
pub enum Times {
    /// Shortest exact form (`0`, `0.5`): virtual time.
    Exact,
    /// Two decimals (`0.53`): real time.
    Centiseconds,
}

/// The header line, for send-time columns `width` characters wide.
pub fn header(width: usize) -> String {
    format!(
        "   {:<18} {:<width$} {:>4} {:>4}",
        "buckets", "sent at (s)", "200", "429"
    )
}

/// One row: the layout (`shared` bucket or one per worker), the send times
/// (µs, any order) and the strict server's 200s and 429s for them.
pub fn row(shared: bool, sends: &[u64], times: Times, width: usize) -> String {
    let mut sends = sends.to_vec();
    sends.sort_unstable();
    let tally = StrictServer::new(3, 2, 1_000_000).replay(&sends);
    let written: Vec<String> = sends
        .iter()
        .map(|&t| match times {
            Times::Exact => format!("{}", t as f64 / 1e6),
            Times::Centiseconds => format!("{:.2}", t as f64 / 1e6),
        })
        .collect();
    let label = if shared {
        "one shared bucket"
    } else {
        "one per worker"
    };
    format!(
        "   {:<18} {:<width$} {:>4} {:>4}",
        label,
        written.join(" "),
        tally.ok,
        tally.rejected
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_counts_what_the_strict_server_answers() {
        let r = row(true, &[0, 0, 0, 500_000], Times::Exact, 20);
        assert!(r.contains("0 0 0 0.5"), "{r}");
        assert!(r.trim_end().ends_with("4    0"), "{r}");
        let r = row(false, &[0, 0, 0, 0], Times::Centiseconds, 20);
        assert!(r.trim_end().ends_with("3    1"), "{r}");
    }
}
