//! The local wait queue of `enqueue`: per state key, a line whose head books
//! in the store. Strict priority with one turn in [`Priority::MIN_SHARE`] for a lower
//! level's oldest call, deficit round robin over flows, FIFO within a flow.

mod drr;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::Priority;
use crate::limits::Cost;
use crate::state::LimitSpec;
use crate::stats::{FlowStats, Histogram, QueueStats};
use crate::store::TurnAsk;
use drr::{Entry, Flows};

/// The least time a flow stays in the shared turn ledger after its last ask.
const ACTIVE_AT_LEAST: Duration = Duration::from_secs(1);

/// The lines of one resource id, by state key.
#[derive(Debug, Default)]
pub(crate) struct Lines {
    lines: Mutex<HashMap<String, Line>>,
    next: AtomicU64,
    /// By priority.
    pub(crate) waits: [Histogram; 3],
}

/// The waiters of one state key.
#[derive(Debug, Default)]
struct Line {
    levels: [Flows; 3],
    head: Option<Head>,
    /// Turns given to a higher level since a waiting lower one had one.
    over_lower: u32,
}

/// The waiter that may book now.
#[derive(Debug)]
struct Head {
    priority: Priority,
    flow: Arc<str>,
    entry: Entry,
    /// It got its turn by a lower level's minimum share: not displaced.
    by_share: bool,
    /// When its cost fits, as the store last told it.
    due: Option<tokio::time::Instant>,
}

/// `cost` as the time it refills in the slowest bucket of `spec`, µs (at
/// least 1): a DRR cost, and the unit of the horizons.
pub(crate) fn units(spec: &LimitSpec, cost: Cost) -> u64 {
    spec.buckets
        .iter()
        .map(|(unit, p)| (cost.of(*unit) as f64 * p.micros_per_token()).ceil() as u64)
        .fold(1, u64::max)
}

/// How far ahead a head of `priority` books a cost of `units`: batch one
/// interval, default two, interactive four (so lower levels keep their
/// share). `None` without rate limits: nothing to space.
pub(crate) fn horizon(priority: Priority, spec: &LimitSpec, units: u64) -> Option<Duration> {
    let intervals = match priority {
        _ if spec.buckets.is_empty() => return None,
        Priority::Interactive => 4,
        Priority::Default => 2,
        Priority::Batch => 1,
    };
    Some(Duration::from_micros(units.saturating_mul(intervals)))
}

impl Line {
    fn is_empty(&self) -> bool {
        self.head.is_none() && self.levels.iter().all(Flows::is_empty)
    }

    /// Makes the next waiter head, if there is none.
    fn promote(&mut self) {
        let top = (0..3).rev().find(|&p| !self.levels[p].is_empty());
        let Some(top) = top.filter(|_| self.head.is_none()) else {
            return;
        };
        let lower = (0..top)
            .filter(|&p| !self.levels[p].is_empty())
            .min_by_key(|&p| self.levels[p].oldest().map(|(id, _)| id));
        let (level, by_share, over_lower) = match lower {
            Some(p) if self.over_lower + 1 >= Priority::MIN_SHARE => (p, true, 0),
            Some(_) => (top, false, self.over_lower + 1),
            None => (top, false, 0),
        };
        self.over_lower = over_lower;
        let Some((flow, entry)) = self.levels[level].pop(by_share) else {
            return;
        };
        entry.wake.notify_one();
        self.head = Some(Head {
            priority: Priority::ALL[level],
            flow,
            entry,
            by_share,
            due: None,
        });
    }
}

/// An `enqueue` call's place in the line of its state key: joined for
/// each booking, left once booked or dropped.
#[derive(Debug)]
pub(crate) struct Ticket {
    lines: Arc<Lines>,
    key: String,
    pub(crate) priority: Priority,
    flow: Arc<str>,
    /// Its place, cost and weight in its flow, kept when it joins again.
    entry: Entry,
}

impl Ticket {
    /// A ticket on state `key`; `flow` is a fingerprint (empty: none).
    pub(crate) fn new(
        lines: &Arc<Lines>,
        key: &str,
        priority: Priority,
        (flow, weight): (Arc<str>, u32),
        units: u64,
    ) -> Self {
        Self {
            lines: lines.clone(),
            key: key.to_owned(),
            priority,
            flow,
            entry: Entry {
                id: lines.next.fetch_add(1, Ordering::Relaxed),
                units,
                weight,
                wake: Arc::default(),
            },
        }
    }

    /// Its cost (see [`units`]).
    pub(crate) fn units(&self) -> u64 {
        self.entry.units
    }

    /// Runs `f` on this call's line, if there is one.
    fn on_line<T>(&self, f: impl FnOnce(&mut Line) -> T) -> Option<T> {
        self.lines.lines.lock().get_mut(&self.key).map(f)
    }

    /// This call's place as the head of `line`, if it is.
    fn head_of<'l>(&self, line: &'l mut Line) -> Option<&'l mut Head> {
        line.head.as_mut().filter(|h| h.entry.id == self.entry.id)
    }

    /// Its ask of the store's shared turn ledger; `None` without a flow.
    pub(crate) fn ask(&self) -> Option<TurnAsk<'_>> {
        let interval = Duration::from_micros(self.entry.units);
        let queued = self.on_line(|l| l.levels[self.priority.index()].has(&self.flow));
        (!self.flow.is_empty()).then(|| TurnAsk {
            level: self.priority.index() as u8,
            flow: &self.flow,
            weight: self.entry.weight,
            units: self.entry.units,
            last: queued != Some(true),
            active: interval.saturating_mul(4).max(ACTIVE_AT_LEAST),
        })
    }

    /// Joins the line (again: in the place the call had in its flow).
    pub(crate) fn join(&self) {
        let mut lines = self.lines.lines.lock();
        let line = lines.entry(self.key.clone()).or_default();
        line.levels[self.priority.index()].push(&self.flow, self.entry.clone(), false);
        // A higher priority takes the turn of a head not booked yet.
        let displaced = (line.head).take_if(|h| h.priority < self.priority && !h.by_share);
        if let Some(head) = displaced {
            head.entry.wake.notify_one();
            line.levels[head.priority.index()].push(&head.flow, head.entry, true);
        }
        line.promote();
    }

    /// Whether this call is the head of its line.
    pub(crate) fn is_head(&self) -> bool {
        self.on_line(|l| self.head_of(l).is_some()) == Some(true)
    }

    /// Waits until this call is the head of its line.
    pub(crate) async fn turn(&self) {
        while !self.is_head() {
            self.entry.wake.notified().await;
        }
    }

    /// Waits `d`, or until woken (time given back, or the turn taken).
    pub(crate) async fn nap(&self, d: Duration) {
        let _ = tokio::time::timeout(d, self.entry.wake.notified()).await;
    }

    /// Leaves the line, if in it: the next waiter becomes head at once.
    pub(crate) fn leave(&self) {
        let mut lines = self.lines.lines.lock();
        let Some(line) = lines.get_mut(&self.key) else {
            return;
        };
        if line.head.take_if(|h| h.entry.id == self.entry.id).is_some() {
            line.promote();
        } else {
            line.levels[self.priority.index()].remove(&self.flow, self.entry.id);
        }
        if line.is_empty() {
            lines.remove(&self.key);
        }
    }

    /// The head was told by the store that its cost fits at `due`.
    pub(crate) fn set_due(&self, due: tokio::time::Instant) {
        self.on_line(|l| self.head_of(l).map(|h| h.due = Some(due)));
    }

    /// An estimate of this call's wait: the head's time still ahead, then
    /// the refill time of every call ahead of it and its own.
    pub(crate) fn ahead(&self) -> Duration {
        let ahead = self.on_line(|line| {
            let queued: u64 = (self.priority.index()..3)
                .flat_map(|p| line.levels[p].entries().map(move |(_, e)| (p, e)))
                .filter(|(p, e)| *p > self.priority.index() || e.id < self.entry.id)
                .map(|(_, e)| e.units)
                .sum();
            let due = line.head.as_ref().and_then(|h| h.due);
            let head = due.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
            head.unwrap_or_default()
                + Duration::from_micros(queued.saturating_add(self.entry.units))
        });
        ahead.unwrap_or_default()
    }
}

impl Lines {
    /// Time was given back on state `key`: wakes its head to ask again.
    pub(crate) fn gave_back(&self, key: &str) {
        let lines = self.lines.lock();
        if let Some(head) = lines.get(key).and_then(|l| l.head.as_ref()) {
            head.entry.wake.notify_one();
        }
    }

    /// The queue's stats: depth per priority, the busiest flows, waits.
    pub(crate) fn stats(&self) -> QueueStats {
        let lines = self.lines.lock();
        let mut depth = [0u64; 3];
        let mut flows: HashMap<&Arc<str>, (u64, u64)> = HashMap::new();
        for line in lines.values() {
            let head = (line.head.iter()).map(|h| (h.priority.index(), &h.flow, &h.entry));
            let queued = (0..3).flat_map(|p| line.levels[p].entries().map(move |(f, e)| (p, f, e)));
            for (p, flow, entry) in queued.chain(head) {
                depth[p] += 1;
                let f = flows.entry(flow).or_default();
                (f.0, f.1) = (f.0 + 1, f.1 + entry.units);
            }
        }
        let flows = flows
            .into_iter()
            .filter(|(name, _)| !name.is_empty())
            .map(|(name, (queued, units))| FlowStats {
                flow: name.to_string(),
                queued,
                queued_cost_ms: units / 1000,
            })
            .collect();
        crate::stats::queue_snapshot(&self.waits, depth, flows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(lines: &Arc<Lines>, p: Priority, flow: &str) -> Ticket {
        let t = Ticket::new(lines, "k", p, (flow.into(), 1), 1);
        t.join();
        t
    }

    #[test]
    fn a_higher_priority_takes_the_turn_of_an_unbooked_head() {
        let lines = Arc::new(Lines::default());
        let batch = ticket(&lines, Priority::Batch, "");
        assert!(batch.is_head());
        let interactive = ticket(&lines, Priority::Interactive, "");
        assert!(interactive.is_head() && !batch.is_head());
    }

    #[test]
    fn a_lower_level_gets_one_turn_in_min_share() {
        let lines = Arc::new(Lines::default());
        let mut high: Vec<Ticket> = (0..30)
            .map(|_| ticket(&lines, Priority::Interactive, ""))
            .collect();
        let low = ticket(&lines, Priority::Batch, "");
        let mut turns = 0;
        while !low.is_head() {
            let at = high.iter().position(Ticket::is_head).expect("a head");
            high.remove(at).leave();
            turns += 1;
        }
        low.leave();
        // The head when it came, then nine more: its turn is the tenth.
        assert_eq!(turns, Priority::MIN_SHARE as usize);
    }

    #[test]
    fn horizons_are_token_intervals_of_the_slowest_bucket_scaled_by_cost() {
        use crate::limits::{Limits, RateLimit, Unit};
        let limits = Limits::new()
            .rate(RateLimit::per_second(10))
            .rate(RateLimit::per(1000, Duration::from_secs(60)).unit(Unit::Tokens));
        let spec = LimitSpec::new(&limits, Duration::from_secs(60));
        let ms = |d: Option<Duration>| d.map(|d| d.as_millis());
        // One request: 100 ms; 500 tokens: 30 s, the slower.
        let one = units(&spec, Cost::requests(1));
        let big = units(&spec, Cost::tokens(500));
        assert_eq!((one, big), (100_000, 30_000_000));
        assert_eq!(ms(horizon(Priority::Batch, &spec, one)), Some(100));
        assert_eq!(ms(horizon(Priority::Default, &spec, one)), Some(200));
        assert_eq!(ms(horizon(Priority::Interactive, &spec, one)), Some(400));
        assert_eq!(ms(horizon(Priority::Batch, &spec, big)), Some(30_000));
        let unlimited = LimitSpec::new(&Limits::new(), Duration::from_secs(60));
        assert_eq!(horizon(Priority::Batch, &unlimited, 1), None);
    }

    #[test]
    fn the_lines_are_gone_once_every_waiter_left() {
        let lines = Arc::new(Lines::default());
        let ts: Vec<Ticket> = (0..5)
            .map(|_| ticket(&lines, Priority::Default, "f"))
            .collect();
        ts.iter().for_each(Ticket::leave);
        assert!(lines.lines.lock().is_empty());
    }
}
