//! The waiters of one priority level, by flow: deficit round robin over
//! flows by cost, weighted; first in, first out within a flow.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// A waiter in its flow's queue.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    /// When the call first joined: its place in its flow.
    pub(super) id: u64,
    /// Its cost (see `queue::units`).
    pub(super) units: u64,
    pub(super) weight: u32,
    pub(super) wake: Arc<tokio::sync::Notify>,
}

/// One flow's waiters and its deficit.
#[derive(Debug, Default)]
struct Flow {
    queue: VecDeque<Entry>,
    deficit: u64,
    weight: u32,
    /// It had its quantum for its current turn at the front.
    in_turn: bool,
}

/// The waiters of one priority level; a flow is kept only while it has
/// waiters.
#[derive(Debug, Default)]
pub(super) struct Flows {
    flows: HashMap<Arc<str>, Flow>,
    /// The flows with waiters, in round-robin order.
    active: VecDeque<Arc<str>>,
    /// The quantum of weight 1: the largest cost seen.
    quantum: u64,
}

impl Flows {
    /// Whether no waiter is queued at this level.
    pub(super) fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    /// The `id` and flow of the longest-waiting waiter, if any.
    pub(super) fn oldest(&self) -> Option<(u64, &Arc<str>)> {
        (self.flows.iter())
            .filter_map(|(n, f)| f.queue.front().map(|e| (e.id, n)))
            .min()
    }

    /// Queues `entry` in `flow`, in its place by `id`; `credit` gives back
    /// the deficit its turn took.
    pub(super) fn push(&mut self, flow: &Arc<str>, entry: Entry, credit: bool) {
        self.quantum = self.quantum.max(entry.units);
        match self.flows.contains_key(flow) {
            true => {}
            false if credit => self.active.push_front(flow.clone()),
            false => self.active.push_back(flow.clone()),
        }
        let f = self.flows.entry(flow.clone()).or_default();
        f.weight = entry.weight.max(1);
        f.deficit += if credit { entry.units } else { 0 };
        let at = f.queue.partition_point(|e| e.id < entry.id);
        f.queue.insert(at, entry);
    }

    /// Takes the next waiter by deficit round robin or, if `oldest`, the
    /// longest-waiting one out of turn, charging its flow.
    pub(super) fn pop(&mut self, oldest: bool) -> Option<(Arc<str>, Entry)> {
        if oldest {
            let name = self.oldest()?.1.clone();
            let f = self.flows.get_mut(&name)?;
            f.deficit = f.deficit.saturating_sub(f.queue.front()?.units);
            return self.take(&name, 0);
        }
        loop {
            let name = self.active.front()?.clone();
            let quantum = self.quantum.max(1);
            let f = self.flows.get_mut(&name)?;
            if !f.in_turn {
                f.deficit = f.deficit.saturating_add(quantum * u64::from(f.weight));
                f.in_turn = true;
            }
            let units = f.queue.front()?.units;
            if f.deficit >= units {
                f.deficit -= units;
                return self.take(&name, 0);
            }
            f.in_turn = false;
            self.active.rotate_left(1);
        }
    }

    /// Removes waiter `id` of `flow`; whether it was there.
    pub(super) fn remove(&mut self, flow: &Arc<str>, id: u64) -> bool {
        let at = (self.flows.get(flow)).and_then(|f| f.queue.iter().position(|e| e.id == id));
        at.and_then(|at| self.take(flow, at)).is_some()
    }

    /// Takes the waiter at `at` of `flow`, dropping the flow once empty.
    fn take(&mut self, flow: &Arc<str>, at: usize) -> Option<(Arc<str>, Entry)> {
        let f = self.flows.get_mut(flow)?;
        let entry = f.queue.remove(at)?;
        if f.queue.is_empty() {
            self.flows.remove(flow);
            self.active.retain(|n| n != flow);
        }
        Some((flow.clone(), entry))
    }

    /// Whether `flow` has waiters queued at this level.
    pub(super) fn has(&self, flow: &Arc<str>) -> bool {
        self.flows.contains_key(flow)
    }

    /// Each flow with its waiters.
    pub(super) fn entries(&self) -> impl Iterator<Item = (&Arc<str>, &Entry)> {
        (self.flows.iter()).flat_map(|(n, f)| f.queue.iter().map(move |e| (n, e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64, units: u64) -> Entry {
        Entry {
            id,
            units,
            weight: 1,
            wake: Arc::default(),
        }
    }

    #[test]
    fn weighted_flows_split_turns_by_weight() {
        let mut flows = Flows::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        for i in 0..400 {
            flows.push(
                &a,
                Entry {
                    weight: 3,
                    ..entry(2 * i, 1)
                },
                false,
            );
            flows.push(&b, entry(2 * i + 1, 1), false);
        }
        let served: Vec<Arc<str>> = (0..400).map(|_| flows.pop(false).unwrap().0).collect();
        let to_a = served.iter().filter(|n| **n == a).count();
        assert_eq!(to_a, 300);
    }

    #[test]
    fn a_flow_leaves_no_entry_once_empty() {
        let mut flows = Flows::default();
        let a: Arc<str> = "a".into();
        flows.push(&a, entry(1, 5), false);
        assert!(flows.remove(&a, 1));
        assert!(flows.flows.is_empty() && flows.active.is_empty());
        assert!(flows.is_empty());
    }

    #[test]
    fn a_returning_waiter_keeps_its_place() {
        let mut flows = Flows::default();
        let a: Arc<str> = "a".into();
        flows.push(&a, entry(5, 1), false);
        flows.push(&a, entry(2, 1), true);
        assert_eq!(flows.pop(false).unwrap().1.id, 2);
    }
}
