//! [`States`]: the states by key, in shards of a hash table, each under its
//! own lock. A lookup hashes the key's two parts as they are (no joined
//! string) and compares them directly.
//!
//! Keys carry user data (tenant ids); foldhash with a per-process random
//! seed keeps the hash a few nanoseconds (SipHash costs more than the whole
//! decision) at the price of weaker, not absent, resistance to deliberately
//! colliding keys.

use lock_api::{RwLockReadGuard, RwLockWriteGuard};
use std::hash::{BuildHasher, Hasher};

use crate::biased::{BiasedRwLock, RawBiased};

use hashbrown::HashTable;

use crate::key::{KeyRef, StateKey};
use crate::Entry;

/// The states by key. What a lookup reads before its shard (the shards,
/// the shift and the hash's seeds) lies on one cache line: the seeds are
/// kept here, not read through `foldhash`'s process-wide seed (a pointer
/// in the global offset table and the static it points at: two lines
/// more per lookup, which a busy server's request finds evicted).
#[repr(C, align(64))]
pub(crate) struct States {
    shards: Box<[Shard]>,
    /// Shifts a hash's top bits down to a shard index.
    shift: u32,
    /// Random per table, as the shared seeds.
    per_hasher_seed: u64,
    shared_seed: foldhash::SharedSeed,
}

/// One shard, on a cache line pair of its own so that two threads locking
/// neighbouring shards do not share a line. A `try` on an existing state
/// made for the caller's limits, or a release, takes the read lock (a
/// one-bucket state is updated in its [`crate::cell`], any other under its
/// own lock); everything else takes the write lock.
#[repr(align(128))]
struct Shard(BiasedRwLock<Table>);

/// The table of one shard.
type Table = HashTable<Row>;

/// One entry of a table, with its key. Laid out so that a one-bucket
/// state's [`crate::cell::BucketCell`] (32 bytes) never spans two cache
/// lines, at no cost in size (on 64-bit targets): a row is 96 bytes
/// aligned to 32, so rows start at 0 or 32 in a line, and the cell sits
/// 64 bytes into the row (the key's 48 bytes, then [`Entry`]'s `spec`,
/// then the state, whose cell follows its tag). A cell split across two lines costs two lines
/// passed back and forth per decision when threads share a key: two
/// threads on one key took 0.9 to 1.6 times governor's time in the runs
/// whose table landed that way, and 0.3 to 0.55 otherwise. The test
/// `cells_lie_within_one_cache_line` checks the layout.
#[repr(C, align(32))]
struct Row(StateKey, Entry);

impl std::fmt::Debug for States {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("States")
            .field("shards", &self.shards.len())
            .finish()
    }
}

impl States {
    /// Four shards per core, rounded up to a power of two.
    pub(crate) fn new() -> Self {
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        let count = (cores * 4).next_power_of_two().max(4);
        // Two random words from `foldhash`'s own random state (seeded per
        // process and per instance).
        let random = foldhash::fast::RandomState::default();
        Self {
            shards: (0..count)
                .map(|_| Shard(BiasedRwLock::new(HashTable::new())))
                .collect(),
            shift: 64 - count.trailing_zeros(),
            per_hasher_seed: random.hash_one(0u64),
            shared_seed: foldhash::SharedSeed::from_u64(random.hash_one(1u64)),
        }
    }

    /// The hash `key` is found by: random per table, so a client cannot
    /// pick keys that share one (see [`crate::spill`], which places a
    /// dropped state by it).
    #[inline]
    pub(crate) fn hash(&self, key: KeyRef<'_>) -> u64 {
        let mut h = foldhash::fast::FoldHasher::with_seed(self.per_hasher_seed, &self.shared_seed);
        h.write_u64(key.resource_hash ^ key.kind as u64);
        h.write(key.sub);
        h.finish()
    }

    /// The index of the shard `key` is held in.
    #[cfg(test)]
    pub(crate) fn shard_index(&self, key: KeyRef<'_>) -> usize {
        ((self.hash(key) << 7) >> self.shift) as usize
    }

    #[inline]
    fn shard_of(&self, hash: u64) -> &Shard {
        // The table takes its tags from the top 7 bits and its positions
        // from the low ones: the shard is picked by the bits just below
        // the tag's, so entries of one shard still differ in their tags.
        &self.shards[((hash << 7) >> self.shift) as usize]
    }

    #[inline]
    fn shard(&self, hash: u64) -> RwLockWriteGuard<'_, RawBiased, Table> {
        self.shard_of(hash).0.write()
    }

    #[inline]
    fn shard_read(&self, hash: u64) -> RwLockReadGuard<'_, RawBiased, Table> {
        self.shard_of(hash).0.read()
    }

    /// Runs `f` on the entry of `key` under its shard's read lock (other
    /// threads may be reading it too); `None` when there is none.
    #[inline]
    pub(crate) fn read<R>(&self, key: KeyRef<'_>, f: impl FnOnce(&Entry) -> R) -> Option<R> {
        let hash = self.hash(key);
        let shard = self.shard_read(hash);
        shard
            .find(hash, |Row(k, _)| k.is(key))
            .map(|Row(_, e)| f(e))
    }

    /// Runs `f` on the entry of `key` under its shard's write lock; `None` when
    /// there is none.
    pub(crate) fn get<R>(&self, key: KeyRef<'_>, f: impl FnOnce(&mut Entry) -> R) -> Option<R> {
        let hash = self.hash(key);
        let mut shard = self.shard(hash);
        shard
            .find_mut(hash, |Row(k, _)| k.is(key))
            .map(|Row(_, e)| f(e))
    }

    /// Runs `f` on the entry of `key` under its shard's write lock, inserting
    /// `make(hash)` (`hash`: the key's [`States::hash`]) under the key
    /// `owned()` when there is none; true in the
    /// second place when it inserted.
    #[inline]
    pub(crate) fn upsert<R>(
        &self,
        key: KeyRef<'_>,
        owned: impl FnOnce() -> StateKey,
        make: impl FnOnce(u64) -> Entry,
        f: impl FnOnce(&mut Entry) -> R,
    ) -> (R, bool) {
        let hash = self.hash(key);
        let mut shard = self.shard(hash);
        // Found (the common case): one probe, and no check for room to
        // insert.
        if let Some(Row(_, e)) = shard.find_mut(hash, |Row(k, _)| k.is(key)) {
            return (f(e), false);
        }
        let rehash = |Row(k, _): &Row| self.hash(k.as_ref());
        let mut slot = shard.insert_unique(hash, Row(owned(), make(hash)), rehash);
        (f(&mut slot.get_mut().1), true)
    }

    /// Number of entries (each shard counted under its lock in turn).
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.read().len()).sum()
    }

    /// Runs `f` on every entry, one shard at a time under its read lock.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&Entry)) {
        for s in self.shards.iter() {
            s.0.read().iter().for_each(|Row(_, e)| f(e));
        }
    }

    /// Keeps the entries for which `keep` says so, one shard at a time.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&StateKey, &Entry) -> bool) {
        for s in self.shards.iter() {
            let mut shard = s.0.write();
            shard.retain(|Row(k, e)| keep(k, e));
            if shard.capacity() > 64 && shard.len() < shard.capacity() / 4 {
                shard.shrink_to_fit(|Row(k, _)| self.hash(k.as_ref()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{resource_hash, KeyRef};
    use crate::{Slot, Stored};
    use broker_core::{LimitSpec, Limits, RateLimit};
    use std::sync::Arc;
    use std::time::Duration;

    /// What a lookup reads before its shard lies on one cache line (see
    /// [`States`]): the shards, the shift and the two seeds a short key's
    /// hash reads.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_lookups_fields_share_one_cache_line() {
        use std::mem::{align_of, offset_of};
        assert_eq!(align_of::<States>(), 64);
        let seeds = offset_of!(States, shared_seed);
        assert!(seeds + 16 <= 64, "the seeds end at {}", seeds + 16);
        assert!(offset_of!(States, shift) + 4 <= 64);
    }

    /// Whether the 32 bytes at `cell` lie within one 64-byte line.
    fn within_one_line(cell: &crate::cell::BucketCell) -> bool {
        let at = cell as *const _ as usize;
        at % 64 + std::mem::size_of_val(cell) <= 64
    }

    /// Every one-bucket state's cell, in the table's rows and in a pin,
    /// lies within one cache line, whatever the tables' sizes; and a row
    /// is no larger than its key and entry. The layout is worked out for
    /// 64-bit targets.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn cells_lie_within_one_cache_line() {
        assert_eq!(std::mem::size_of::<crate::cell::BucketCell>(), 32);
        assert_eq!(
            std::mem::size_of::<Row>(),
            std::mem::size_of::<(StateKey, Entry)>(),
        );
        let limits = Limits::new().rate(RateLimit::per_second(5));
        let spec = Arc::new(LimitSpec::new(&limits, Duration::from_secs(60)));
        let states = States::new();
        let hash = resource_hash("tenants");
        let mut seen = 0;
        for n in [1, 2, 3, 5, 9, 17, 100, 1000] {
            for i in 0..n {
                let sub = format!("tenant-{i}");
                let key = KeyRef::local("tenants", hash, Some(&sub));
                states.upsert(
                    key,
                    || key.to_owned_with(None),
                    |_| Entry {
                        spec: spec.clone(),
                        state: Slot::Table(Stored::fresh(&spec, 0)),
                    },
                    |_| (),
                );
            }
            states.retain(|_, e| {
                let Slot::Table(Stored::One(cell)) = &e.state else {
                    panic!("a one-bucket state is held as a cell in its row");
                };
                assert!(within_one_line(cell), "a cell at {cell:p} spans two lines");
                seen += 1;
                true
            });
        }
        assert!(seen > 1000, "{seen} cells checked");
        let mut slot = Slot::Table(Stored::fresh(&spec, 0));
        let pin = slot.pin();
        let Stored::One(cell) = pin.state() else {
            panic!("a one-bucket state is held as a cell in its pin");
        };
        assert!(
            within_one_line(cell),
            "a pinned cell at {cell:p} spans two lines"
        );
    }
}
