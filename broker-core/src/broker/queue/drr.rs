//! The waiters of one priority level, by flow: deficit round robin over
//! flows by cost, weighted; first in, first out within a flow.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// A waiter in its flow's queue.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) id: u64,
    /// When the call first joined: its place in its flow.
    pub(super) seq: u64,
    /// Its cost (see `queue::units`).
    pub(super) units: u64,
    pub(super) weight: u32,
    pub(super) wake: Arc<tokio::sync::Notify>,
}

/// One flow's waiters and its deficit.
#[derive(Debug)]
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
    len: usize,
}

impl Flows {
    /// Waiters queued at this level.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The `seq` of the longest-waiting waiter, if any.
    pub(super) fn oldest(&self) -> Option<u64> {
        self.flows
            .values()
            .filter_map(|f| f.queue.front().map(|e| e.seq))
            .min()
    }

    /// Queues `entry` in `flow`, in its place by `seq`; `credit` gives
    /// back the deficit its turn took.
    pub(super) fn push(&mut self, flow: &Arc<str>, entry: Entry, credit: bool) {
        let weight = entry.weight;
        self.quantum = self.quantum.max(entry.units);
        let units = entry.units;
        let f = match self.flows.get_mut(flow) {
            Some(f) => f,
            None => {
                if credit {
                    self.active.push_front(flow.clone());
                } else {
                    self.active.push_back(flow.clone());
                }
                self.flows.entry(flow.clone()).or_insert(Flow {
                    queue: VecDeque::new(),
                    deficit: 0,
                    weight,
                    in_turn: false,
                })
            }
        };
        f.weight = weight.max(1);
        let at = f.queue.partition_point(|e| e.seq < entry.seq);
        f.queue.insert(at, entry);
        if credit {
            f.deficit += units;
        }
        self.len += 1;
    }

    /// Takes the next waiter by deficit round robin.
    pub(super) fn pop(&mut self) -> Option<(Arc<str>, Entry)> {
        loop {
            let name = self.active.front()?.clone();
            let quantum = self.quantum.max(1);
            let f = self.flows.get_mut(&name)?;
            if !f.in_turn {
                f.deficit = f.deficit.saturating_add(quantum * u64::from(f.weight));
                f.in_turn = true;
            }
            let units = f.queue.front().map_or(0, |e| e.units);
            if f.deficit >= units {
                f.deficit -= units;
                let entry = f.queue.pop_front()?;
                self.len -= 1;
                if f.queue.is_empty() {
                    self.flows.remove(&name);
                    self.active.pop_front();
                }
                return Some((name, entry));
            }
            f.in_turn = false;
            self.active.rotate_left(1);
        }
    }

    /// Takes the longest-waiting waiter out of turn, charging its flow.
    pub(super) fn pop_oldest(&mut self) -> Option<(Arc<str>, Entry)> {
        let name = self
            .flows
            .iter()
            .filter_map(|(n, f)| f.queue.front().map(|e| (e.seq, n)))
            .min()
            .map(|(_, n)| n.clone())?;
        let f = self.flows.get_mut(&name)?;
        let entry = f.queue.pop_front()?;
        f.deficit = f.deficit.saturating_sub(entry.units);
        self.len -= 1;
        if f.queue.is_empty() {
            self.flows.remove(&name);
            self.active.retain(|n| *n != name);
        }
        Some((name, entry))
    }

    /// Removes waiter `id` of `flow`; whether it was there.
    pub(super) fn remove(&mut self, flow: &Arc<str>, id: u64) -> bool {
        let Some(f) = self.flows.get_mut(flow) else {
            return false;
        };
        let Some(at) = f.queue.iter().position(|e| e.id == id) else {
            return false;
        };
        f.queue.remove(at);
        self.len -= 1;
        if f.queue.is_empty() {
            self.flows.remove(flow);
            self.active.retain(|n| n != flow);
        }
        true
    }

    /// Whether `flow` has waiters queued at this level.
    pub(super) fn has(&self, flow: &Arc<str>) -> bool {
        self.flows.contains_key(flow)
    }

    /// Each flow with its waiters' count and cost units.
    pub(super) fn per_flow(&self) -> impl Iterator<Item = (&Arc<str>, u64, u64)> {
        self.flows.iter().map(|(n, f)| {
            let units = f.queue.iter().map(|e| e.units).sum();
            (n, f.queue.len() as u64, units)
        })
    }

    /// The cost units of the waiters queued before `seq` (all flows).
    pub(super) fn units_before(&self, seq: u64) -> u64 {
        self.flows
            .values()
            .flat_map(|f| f.queue.iter())
            .filter(|e| e.seq < seq)
            .map(|e| e.units)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64, units: u64) -> Entry {
        Entry {
            id,
            seq: id,
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
        let served: Vec<Arc<str>> = (0..400).map(|_| flows.pop().unwrap().0).collect();
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
        assert_eq!(flows.len(), 0);
    }

    #[test]
    fn a_returning_waiter_keeps_its_place() {
        let mut flows = Flows::default();
        let a: Arc<str> = "a".into();
        flows.push(&a, entry(5, 1), false);
        flows.push(&a, entry(2, 1), true);
        assert_eq!(flows.pop().unwrap().1.id, 2);
    }
}
