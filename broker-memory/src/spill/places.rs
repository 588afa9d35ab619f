//! A resource part's places for one set of limits: groups of [`WAYS`]
//! places, each marked with its key, and one state per group for the rest.

use broker_core::bucket::{BucketParams, BucketState};
use broker_core::Micros;
use parking_lot::Mutex;

use super::merge::idle;
use crate::eviction::RECENT;

/// Places in a group: the keys a group keeps apart.
pub(super) const WAYS: usize = 8;

/// A place nothing was folded into: a full bucket, which `tighter` ignores.
const EMPTY: BucketState = BucketState {
    tokens: f64::INFINITY,
    ts: 0,
    nb: 0,
};

/// One resource part's places for states made for `params`.
#[derive(Debug)]
pub(super) struct Places {
    pub(super) params: Box<[BucketParams]>,
    pub(super) table: Mutex<Table>,
}

#[derive(Debug)]
pub(super) struct Table {
    /// Per place: the mark of the key it holds ([`mark`]), 0 for none.
    pub(super) marks: Box<[u64]>,
    /// Per place: the latest time a state was folded into it.
    pub(super) lasts: Box<[Micros]>,
    /// `places × buckets` states, merged under the set's limits.
    pub(super) tight: Box<[BucketState]>,
    /// `places × buckets` states, merged without refilling.
    pub(super) raw: Box<[BucketState]>,
    /// `groups × buckets` states of the keys that found no place of their
    /// own in their group, merged under the set's limits.
    pub(super) over_tight: Box<[BucketState]>,
    /// The same, merged without refilling.
    pub(super) over_raw: Box<[BucketState]>,
    /// The number of groups (a power of two), less one.
    pub(super) mask: usize,
    /// The latest time a state was folded in.
    pub(super) last: Micros,
    /// Dropped from the store: a fold that finds it so looks the set up again.
    pub(super) retired: bool,
}

/// A key's mark in its group: its table hash, never 0.
fn mark(hash: u64) -> u64 {
    hash | 1
}

/// Where a key's state is kept in a set: its own place, or its group's.
#[derive(Clone, Copy)]
pub(super) enum At {
    Own(usize),
    Group(usize),
}

impl Table {
    pub(super) fn new(places: usize, buckets: usize) -> Self {
        let groups = places / WAYS;
        Self {
            marks: vec![0; places].into_boxed_slice(),
            lasts: vec![0; places].into_boxed_slice(),
            tight: vec![EMPTY; places * buckets].into_boxed_slice(),
            raw: vec![EMPTY; places * buckets].into_boxed_slice(),
            over_tight: vec![EMPTY; groups * buckets].into_boxed_slice(),
            over_raw: vec![EMPTY; groups * buckets].into_boxed_slice(),
            mask: groups - 1,
            last: 0,
            retired: false,
        }
    }

    pub(super) fn places(&self) -> usize {
        self.marks.len()
    }

    /// The places of the group of `hash`.
    pub(super) fn group(&self, hash: u64) -> std::ops::Range<usize> {
        let at = (hash as usize & self.mask) * WAYS;
        at..at + WAYS
    }

    /// Where the state of the key with table hash `hash` is read.
    pub(super) fn find(&self, hash: u64) -> At {
        let group = self.group(hash);
        match group.clone().find(|&i| self.marks[i] == mark(hash)) {
            Some(i) => At::Own(i),
            None => At::Group(group.start / WAYS),
        }
    }

    /// Where the key with table hash `hash` is folded at `now`: its own
    /// place, else a free one (never taken, or refilled and not folded into
    /// within [`RECENT`]), else the group's.
    pub(super) fn place_for(&mut self, hash: u64, params: &[BucketParams], now: Micros) -> At {
        if let own @ At::Own(_) = self.find(hash) {
            return own;
        }
        let n = params.len();
        let free = self.group(hash).find(|&i| {
            self.marks[i] == 0
                || (now.saturating_sub(self.lasts[i]) >= RECENT
                    && idle(&self.tight[i * n..(i + 1) * n], params, now))
        });
        match free {
            Some(i) => {
                self.marks[i] = mark(hash);
                self.tight[i * n..(i + 1) * n].fill(EMPTY);
                self.raw[i * n..(i + 1) * n].fill(EMPTY);
                At::Own(i)
            }
            None => At::Group(hash as usize & self.mask),
        }
    }

    /// The tight and raw states kept at `at` for `n` buckets.
    pub(super) fn read(&self, at: At, n: usize) -> (&[BucketState], &[BucketState]) {
        let (tight, raw, r) = match at {
            At::Own(i) => (&self.tight, &self.raw, i * n..(i + 1) * n),
            At::Group(g) => (&self.over_tight, &self.over_raw, g * n..(g + 1) * n),
        };
        (&tight[r.clone()], &raw[r])
    }

    /// [`Table::read`], to write.
    pub(super) fn write(&mut self, at: At, n: usize) -> (&mut [BucketState], &mut [BucketState]) {
        let (tight, raw, r) = match at {
            At::Own(i) => (&mut self.tight, &mut self.raw, i * n..(i + 1) * n),
            At::Group(g) => (&mut self.over_tight, &mut self.over_raw, g * n..(g + 1) * n),
        };
        (&mut tight[r.clone()], &mut raw[r])
    }
}

impl Places {
    /// Whether the set may be dropped: nothing folded in within [`RECENT`]
    /// and every place refilled.
    pub(super) fn spent(&self, table: &Table, now: Micros) -> bool {
        now.saturating_sub(table.last) >= RECENT
            && (table.tight.chunks_exact(self.params.len()))
                .chain(table.over_tight.chunks_exact(self.params.len()))
                .all(|place| idle(place, &self.params, now))
    }
}
