//! # broker-memory
//!
//! [`MemoryBackend`]: resource states in a sharded hash table, each
//! decision applied by calling broker-core's reference transitions, so
//! concurrent use from many tasks and threads is exact. A `try` on an
//! existing state made for the resource's current limits runs under its
//! shard's read lock (biased to readers, so threads deciding at once share
//! no lock line): on a state of one rate limit it updates the bucket in
//! place with a compare-and-swap, on any other state (several limits, a
//! concurrency limit) under that state's own lock, which a release takes
//! as well. Every other transition, and a new state, runs under the
//! shard's write lock. A resource's own state (no sub-key) is pinned by
//! the registration that decides on it, which then reaches it without the
//! hash, the lookup or the shard's lock (see `pinned`). Idle states (equal
//! to a fresh bucket) are evicted, and the number of states is bounded
//! ([`MemoryBackend::max_states`]): past the bound, the states least
//! recently taken from are folded into a fixed table that never hands a
//! key back more than it had (see `spill`), so memory stays bounded when
//! keys are not.
#![warn(missing_docs)]

mod backoff;
mod biased;
mod cell;
mod clock;
mod eviction;
mod key;
mod local;
mod pinned;
mod spill;
mod table;

pub use clock::QuantaClock;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use broker_core::bucket::{BucketState, Shortfall};
use broker_core::clock::micros;
use broker_core::state::{self, ResourceState};
use broker_core::{
    BackendError, Clock, Cost, Decision, LeaseId, LimitSpec, LocalStates, LocalVerdict, Marks,
    Micros, ObservedLimit, Reservation, Verdict,
};
use cell::BucketCell;
use eviction::Sweeper;
use key::KeyRef;
use parking_lot::Mutex;
use pinned::Slot;
use spill::Spills;
pub(crate) use table::States;

/// One process's state store.
///
/// ```
/// use broker_core::{Cost, Limits, RateLimit, ResourceBroker};
/// use broker_memory::MemoryBackend;
/// let broker = ResourceBroker::new(MemoryBackend::new());
/// broker.register_limit("api", Limits::new().rate(RateLimit::per_second(10))).unwrap();
/// ```
#[derive(Debug)]
pub struct MemoryBackend {
    store: Arc<Store>,
}

/// What the backend and the [`LocalStates`] it hands out share.
///
/// `repr(C)`, in this order: a decision reads the clock and the sweeper's
/// first two counts on the store's first cache line, and the table's
/// seeds and shards on the one [`States`] starts (two lines in all; in
/// the compiler's order, the clock alone spanned two).
#[derive(Debug)]
#[repr(C)]
struct Store {
    clock: StoreClock,
    sweeper: Sweeper,
    states: States,
    spills: Spills,
}

/// The clock of a store: the default one read in line (it is read on
/// every decision), any other through its trait object. `repr(C, u8)`:
/// its tag comes first, then the clock (see [`Store`]).
#[derive(Debug)]
#[repr(C, u8)]
enum StoreClock {
    Quanta(QuantaClock),
    Shared(Arc<dyn Clock>),
}

impl StoreClock {
    #[inline]
    fn now(&self) -> u64 {
        match self {
            Self::Quanta(c) => c.now(),
            Self::Shared(c) => c.now(),
        }
    }
}

/// A state and the limits it was made for. In this order (`repr(C)`):
/// the table's rows place a one-bucket state's cell by it (see
/// `table::Row`).
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Entry {
    /// The limits the state was made for (the sweeper needs them to tell an
    /// idle state); a resource re-configured with other buckets starts with
    /// full buckets and keeps its held slots.
    /// Shared by the states of one resource (see [`shared_spec`]), so
    /// checking it reads memory that is already in cache.
    pub(crate) spec: Arc<LimitSpec>,
    pub(crate) state: Slot,
}

/// A state as the table holds it.
#[derive(Debug)]
pub(crate) enum Stored {
    /// The one bucket of a resource with one rate limit and no concurrency
    /// limit (the common case), held in the table's slot itself (or, for a
    /// resource's own state, shared with its registration's pin), where
    /// `try` decisions update it under the shard's read lock (or through
    /// the pin, with no lock).
    One(BucketCell),
    /// Any other state (several limits, or a concurrency limit), behind a
    /// lock of its own: `try` decisions and releases take it under the
    /// shard's read lock (or through a pin), so they wait only for calls on
    /// the same state. Under the write lock, transitions on a state in the
    /// table's slot reach it through `&mut`, and reads take the lock, which
    /// no one else can hold then; on a pinned state, both take the lock.
    Full(Box<Mutex<ResourceState>>),
}

/// The `ResourceState` of a [`Stored::One`] bucket (one small allocation:
/// the keyed transitions on such a state pay it, `try_acquire` through
/// [`LocalStates`] does not).
pub(crate) fn one_state(bucket: BucketState) -> ResourceState {
    ResourceState {
        buckets: vec![bucket],
        leases: Vec::new(),
        hold: 0,
    }
}

/// Whether states made for `spec` are held as [`Stored::One`].
pub(crate) fn one_bucket(spec: &LimitSpec) -> bool {
    spec.buckets.len() == 1 && spec.max_concurrent.is_none()
}

impl Stored {
    /// A [`Stored::Full`] state.
    pub(crate) fn full(s: ResourceState) -> Self {
        Self::Full(Box::new(Mutex::new(s)))
    }

    /// `s`, a state made for `spec`, held as states of `spec` are: as
    /// [`Stored::One`] when `spec` has one bucket and no concurrency
    /// limit and `s` holds no lease (one made for other limits may), else
    /// in full.
    pub(crate) fn of(s: ResourceState, spec: &LimitSpec) -> Self {
        match s.buckets.as_slice() {
            [b] if one_bucket(spec) && s.leases.is_empty() => Self::One(BucketCell::new(*b)),
            _ => Self::full(s),
        }
    }

    fn fresh(spec: &LimitSpec, now: u64) -> Self {
        match spec.buckets.as_slice() {
            [(_, p)] if one_bucket(spec) => Self::One(BucketCell::new(BucketState::fresh(p, now))),
            _ => Self::full(ResourceState::fresh(spec, now)),
        }
    }

    /// The state as the reference transitions take it.
    pub(crate) fn to_state(&self) -> ResourceState {
        match self {
            Self::One(b) => one_state(b.load()),
            Self::Full(s) => s.lock().clone(),
        }
    }

    /// Runs a reference transition on the state; a [`Stored::One`] bucket
    /// goes through a one-bucket `ResourceState` and back (no transition
    /// adds a lease for a spec without a concurrency limit).
    fn with_full<R>(&mut self, f: impl FnOnce(&mut ResourceState) -> R) -> R {
        match self {
            Self::Full(s) => f(s.get_mut()),
            Self::One(b) => {
                let mut s = one_state(b.get());
                let r = f(&mut s);
                debug_assert!(s.leases.is_empty());
                b.set(s.buckets[0]);
                r
            }
        }
    }

    /// A state held nowhere, for the moment a slot's state is moved out.
    fn placeholder() -> Self {
        Self::One(BucketCell::new(BucketState {
            tokens: 0.0,
            ts: 0,
            nb: 0,
        }))
    }

    /// [`Stored::with_full`] through `&self`, while decisions may be in
    /// flight (a pinned state): under the bucket's claim or the state's
    /// lock.
    fn with_shared<R>(&self, f: impl FnOnce(&mut ResourceState) -> R) -> R {
        match self {
            Self::Full(s) => f(&mut s.lock()),
            Self::One(b) => b.update(|b| {
                let mut s = one_state(*b);
                let r = f(&mut s);
                debug_assert!(s.leases.is_empty());
                *b = s.buckets[0];
                r
            }),
        }
    }

    /// `try` on this state, made for `spec`, while other decisions may be
    /// in flight: a one-bucket state by [`BucketCell::try_take`], any other
    /// under its own lock, once `held` (asked under that lock) says the
    /// table still holds the state. `None` for a one-bucket state and a
    /// `spec` of other limits (a state to adopt first), and for a retired
    /// one (a pinned state the table no longer holds: a retired cell
    /// refuses by itself, see [`crate::pinned`]).
    ///
    /// A [`Stored::One`] bucket's denial comes back unrounded: the caller
    /// rounds it ([`Shortfall::micros`]) once any lock is released.
    #[inline(always)]
    pub(crate) fn decide(
        &self,
        spec: &LimitSpec,
        now: u64,
        cost: Cost,
        lease: LeaseId,
        held: impl FnOnce() -> bool,
    ) -> Option<Result<Verdict, Shortfall>> {
        match (self, spec.buckets.as_slice()) {
            (Self::One(b), [(unit, p)]) => b
                .try_take(*unit, p, now, cost)
                .map(|taken| taken.map(|()| Verdict::Allowed)),
            (Self::Full(s), _) => {
                let mut s = s.lock();
                held().then(|| Ok(state::try_acquire(&mut s, spec, now, cost, lease).into()))
            }
            (Self::One(_), _) => None,
        }
    }

    /// Frees the slot held under `lease`, once `held` (asked under the
    /// state's lock, as for [`Stored::decide`]) says the table still holds
    /// the state; `None` when it does not. A one-bucket state holds no
    /// slot.
    pub(crate) fn release(&self, lease: LeaseId, held: impl FnOnce() -> bool) -> Option<bool> {
        match self {
            Self::Full(s) => {
                let mut s = s.lock();
                held().then(|| state::release(&mut s, lease))
            }
            Self::One(_) => Some(false),
        }
    }

    /// When the state was last brought up to date (its buckets' latest
    /// `ts`): every decision that takes from it does.
    pub(crate) fn last_used(&self) -> u64 {
        match self {
            Self::One(b) => b.load().ts,
            Self::Full(s) => s.lock().buckets.iter().map(|b| b.ts).max().unwrap_or(0),
        }
    }

    /// Whether the state holds a slot that has not expired by `now`, or is
    /// under a [`ResourceState::hold`] that has not ended by then (a
    /// one-bucket state holds neither): what a fold would lose.
    pub(crate) fn holds_slot_or_hold(&self, now: u64) -> bool {
        match self {
            Self::One(_) => false,
            Self::Full(s) => {
                let s = s.lock();
                s.hold > now || s.leases.iter().any(|l| l.expires > now)
            }
        }
    }

    /// [`state::is_idle`].
    pub(crate) fn is_idle(&self, spec: &LimitSpec, now: u64) -> bool {
        match (self, spec.buckets.as_slice()) {
            (Self::One(b), [(_, p)]) => broker_core::bucket::is_idle(&b.load(), p, now),
            (Self::Full(s), _) => state::is_idle(&s.lock(), spec, now),
            (Self::One(_), _) => false,
        }
    }
}

impl Slot {
    /// [`state::try_acquire`] on the state, made for `spec` (under the
    /// shard's write lock, for a state just made or adopted). A one-bucket
    /// denial comes back unrounded, as from [`Stored::decide`].
    #[inline]
    fn try_acquire(
        &mut self,
        spec: &LimitSpec,
        now: u64,
        cost: Cost,
        lease: LeaseId,
    ) -> Result<Verdict, Shortfall> {
        match self.get().decide(spec, now, cost, lease, || true) {
            Some(decided) => decided,
            None => Ok(self
                .with_full(|s| state::try_acquire(s, spec, now, cost, lease))
                .into()),
        }
    }
}

/// The verdict of [`Slot::try_acquire`] as [`LocalStates`] answers it (once
/// the lock is released): a denial's wait left for the caller to round
/// where it reads it ([`LocalVerdict::verdict`]).
#[inline]
fn unrounded(v: Result<Verdict, Shortfall>) -> LocalVerdict {
    match v {
        Ok(v) => v.into(),
        Err(short) => short.local_verdict(),
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// A store on the system's monotonic time, read through
    /// [`QuantaClock`].
    pub fn new() -> Self {
        Self::with_store_clock(StoreClock::Quanta(QuantaClock::new()))
    }

    /// A store on `clock` (e.g. [`broker_core::ManualClock`] in tests).
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::with_shared_clock(Arc::new(clock))
    }

    /// A store on a shared clock.
    pub fn with_shared_clock(clock: Arc<dyn Clock>) -> Self {
        Self::with_store_clock(StoreClock::Shared(clock))
    }

    fn with_store_clock(clock: StoreClock) -> Self {
        Self {
            store: Arc::new(Store {
                states: States::new(),
                clock,
                sweeper: Sweeper::default(),
                spills: Spills::new(),
            }),
        }
    }

    /// Bounds the number of states the store holds at `max` (at least 64;
    /// 1,048,576 unless set). Past the bound, idle states are dropped
    /// first; then the states least recently taken from that still count
    /// (not idle, holding no slot, under no penalty of a resource without
    /// rate limits, not a registered resource's own state) are dropped
    /// down to seven eighths of the bound, each folded into a place kept
    /// for its resource and limits: a key dropped so never comes back
    /// with more than it had. It comes back with what it had when it got
    /// a place of its own (the first keys folded into each group of eight
    /// places do, such as keys light before a flood of new ones), else
    /// possibly with less (what the other keys sharing its group's state
    /// took, until that refills). A flood of new keys (random tenant ids)
    /// so cannot grow memory past the bound, nor give any key a fresh
    /// bucket; a flood heavy enough to take the places is denied rather
    /// than let through (see the `spill` module), while the keys in use
    /// stay held. A state of one rate takes about 250 bytes (measured:
    /// `cargo run --release -p broker-memory --example tenant_memory`,
    /// 240 MiB for 1,000,000); the places, as many as the bound at most,
    /// 70 bytes each for one rate. States holding slots are
    /// never dropped, nor states under such a penalty until it ends, nor a
    /// registered resource's own state, so the bound can be passed by as
    /// many as those.
    ///
    /// ```
    /// use broker_memory::MemoryBackend;
    /// let backend = MemoryBackend::new().max_states(100_000);
    /// assert_eq!(backend.state_bound(), 100_000);
    /// ```
    pub fn max_states(self, max: usize) -> Self {
        self.store.sweeper.set_max(max);
        self
    }

    /// The bound on the number of states (see [`MemoryBackend::max_states`]).
    pub fn state_bound(&self) -> usize {
        self.store.sweeper.max()
    }

    /// How many states were dropped at the bound and folded into their
    /// resource's places so far (see [`MemoryBackend::max_states`]).
    pub fn folded(&self) -> u64 {
        self.store.spills.folded()
    }

    /// Number of states held now (idle ones not yet evicted included).
    pub fn len(&self) -> usize {
        self.store.states.len()
    }

    /// True when no state is held.
    pub fn is_empty(&self) -> bool {
        self.store.states.len() == 0
    }

    /// Drops every state that equals a fresh one (full buckets, no penalty,
    /// no live lease) and was not used in the last 50 ms (a key in use is
    /// kept though its bucket refills between calls). A resource's own
    /// state is kept while a registration of the resource decides on it
    /// (one per registered resource). Runs by itself as the map grows;
    /// call it to bound memory at a moment of your choosing.
    pub fn evict_idle(&self) -> usize {
        let store = &self.store;
        let now = store.clock.now();
        let evicted = eviction::evict_idle(&store.states, now);
        store.spills.drop_idle(now);
        store.sweeper.after_sweep(&store.states, now, 0);
        evicted
    }

    /// The state of `key`, if held (for tests and inspection).
    pub fn state(&self, key: &str) -> Option<ResourceState> {
        key::with_parsed(key, |key| {
            self.store.states.get(key, |e| e.state.get().to_state())
        })
    }

    /// Runs the reference transition `f` on the state of the joined state
    /// `key`, made for `spec`.
    fn with_state<R>(
        &self,
        key: &str,
        spec: &LimitSpec,
        f: impl FnOnce(&mut ResourceState, u64) -> R,
    ) -> R {
        key::with_parsed(key, |key| {
            self.store.with_state(
                key,
                None,
                spec,
                || shared_spec(spec),
                |s, now| s.with_full(|s| f(s, now)),
            )
        })
    }

    /// `try_acquire` on the joined state `key`.
    fn try_acquire_sync(&self, key: &str, spec: &LimitSpec, cost: Cost) -> Decision {
        unrounded(key::with_parsed(key, |key| {
            self.store
                .try_acquire(key, None, spec, || shared_spec(spec), cost)
        }))
        .verdict()
        .into()
    }

    fn lease(&self) -> LeaseId {
        next_lease()
    }
}

impl Store {
    /// Runs `f` on the state of `key` under its shard's write lock, creating a fresh
    /// state if there is none. The state is made for `spec`; `shared`
    /// gives the allocation of `spec` a state keeps. `resource` is the
    /// caller's allocation of `key.resource`, if it has one.
    #[inline]
    fn with_state<R>(
        &self,
        key: KeyRef<'_>,
        resource: Option<&Arc<str>>,
        spec: &LimitSpec,
        shared: impl Fn() -> Arc<LimitSpec>,
        f: impl FnOnce(&mut Slot, u64) -> R,
    ) -> R {
        let now = self.clock.now();
        let (result, inserted) = self.states.upsert(
            key,
            || key.to_owned_with(resource),
            |hash| Entry {
                state: Slot::Table(
                    self.spills
                        .restore(key.resource, hash, spec, now)
                        .unwrap_or_else(|| Stored::fresh(spec, now)),
                ),
                spec: shared(),
            },
            |e| f(e.current(spec, &shared, now), now),
        );
        self.sweeper
            .after_write(&self.states, &self.spills, now, inserted);
        result
    }

    /// [`Store::with_state`] on a state that exists: `None`, and nothing
    /// made, when `key` has none.
    fn with_existing<R>(
        &self,
        key: KeyRef<'_>,
        spec: &LimitSpec,
        shared: impl Fn() -> Arc<LimitSpec>,
        f: impl FnOnce(&mut Slot, u64) -> R,
    ) -> Option<R> {
        let now = self.clock.now();
        self.states
            .get(key, |e| f(e.current(spec, &shared, now), now))
    }

    /// `try` on the state of `key` (arguments as for [`Store::with_state`]):
    /// a state made for `spec` is decided under its shard's read lock, so
    /// decisions on one shard run at once (a one-bucket state by
    /// [`BucketCell::try_take`], any other under its own lock); a new
    /// state, or one made for other limits, under the write lock. A
    /// one-bucket denial comes back unrounded (see [`unrounded`]).
    #[inline]
    fn try_acquire(
        &self,
        key: KeyRef<'_>,
        resource: Option<&Arc<str>>,
        spec: &LimitSpec,
        shared: impl Fn() -> Arc<LimitSpec>,
        cost: Cost,
    ) -> Result<Verdict, Shortfall> {
        let now = self.clock.now();
        let lease = lease_for(spec);
        let decided = self.states.read(key, |e| {
            // The broker's calls (`resource` given) pass the allocation the
            // state keeps: another one, even if equal (a registration
            // again with the same limits), is adopted once under the write
            // lock, and not compared by value on every later call.
            let current = match resource {
                Some(_) => e.made_by(spec),
                None => e.made_for(spec),
            };
            if !current {
                return None;
            }
            e.state.get().decide(spec, now, cost, lease, || true)
        });
        if let Some(Some(decided)) = decided {
            // Every decision, a denial too, checks whether a sweep is due: one
            // is due on time as well as on growth, and traffic of denials
            // alone must not keep idle states from being swept.
            self.sweeper
                .after_write(&self.states, &self.spills, now, false);
            return decided;
        }
        self.try_acquire_in_full(key, resource, spec, shared, cost, lease)
    }

    /// [`Store::try_acquire`] past its common case (a new state, one made
    /// for other limits, or a state decided under its own lock), out of
    /// the callers' line: its inserts and their allocations would
    /// otherwise widen the common case's frame.
    #[cold]
    #[inline(never)]
    fn try_acquire_in_full(
        &self,
        key: KeyRef<'_>,
        resource: Option<&Arc<str>>,
        spec: &LimitSpec,
        shared: impl Fn() -> Arc<LimitSpec>,
        cost: Cost,
        lease: LeaseId,
    ) -> Result<Verdict, Shortfall> {
        self.with_state(key, resource, spec, shared, |s, now| {
            s.try_acquire(spec, now, cost, lease)
        })
    }

    /// Frees the slot held under `lease` on the state of `key`.
    fn release(&self, key: KeyRef<'_>, lease: LeaseId) -> bool {
        self.states
            .read(key, |e| e.state.get().release(lease, || true))
            .flatten()
            .unwrap_or(false)
    }

    /// The state of `key`, made for `spec`, pinned for the registration
    /// that calls (arguments as for [`Store::with_state`]).
    fn pin(
        &self,
        key: KeyRef<'_>,
        resource: &Arc<str>,
        spec: &LimitSpec,
        shared: impl Fn() -> Arc<LimitSpec>,
    ) -> Arc<pinned::Pinned> {
        self.with_state(key, Some(resource), spec, shared, |s, _| s.pin())
    }
}

/// A new lease id, unique in the process. Each thread takes a block of ids
/// at a time from one counter, so threads deciding at once do not write
/// one shared line on every lease.
fn next_lease() -> LeaseId {
    const BLOCK: u64 = 1024;
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        /// This thread's next id and the end of its block.
        static MINE: std::cell::Cell<(LeaseId, LeaseId)> = const { std::cell::Cell::new((0, 0)) };
    }
    MINE.try_with(|mine| {
        let (next, end) = match mine.get() {
            (next, end) if next < end => (next, end),
            _ => {
                let start = NEXT.fetch_add(BLOCK, Ordering::Relaxed);
                (start, start + BLOCK)
            }
        };
        mine.set((next + 1, end));
        next
    })
    // A thread whose thread-locals are gone takes one id.
    .unwrap_or_else(|_| NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A lease id for a `try` under `spec` (none needed without a concurrency
/// limit).
pub(crate) fn lease_for(spec: &LimitSpec) -> LeaseId {
    if spec.max_concurrent.is_some() {
        next_lease()
    } else {
        0
    }
}

impl Entry {
    /// Whether the state was made for `spec`: the same allocation (the
    /// broker's calls), or an equal spec (a keyed call, whose spec is the
    /// caller's own): [`Entry::current`] would keep its state as it is.
    #[inline]
    fn made_for(&self, spec: &LimitSpec) -> bool {
        self.made_by(spec) || self.made_for_equal(spec)
    }

    /// Whether the state keeps this very allocation of its spec.
    #[inline]
    fn made_by(&self, spec: &LimitSpec) -> bool {
        std::ptr::eq(Arc::as_ptr(&self.spec), spec)
    }

    /// [`Entry::made_for`] for a spec at another address (kept out of the
    /// broker's path, which passes the same allocation).
    #[cold]
    #[inline(never)]
    fn made_for_equal(&self, spec: &LimitSpec) -> bool {
        *self.spec == *spec
    }

    /// The state, made for `spec` (`shared` gives the allocation to keep):
    /// a resource re-configured with the same number of buckets keeps its
    /// state, one with other buckets starts with full buckets and keeps its
    /// held slots. The common case, a state made for this very allocation,
    /// is one pointer comparison.
    #[inline]
    fn current(
        &mut self,
        spec: &LimitSpec,
        shared: impl Fn() -> Arc<LimitSpec>,
        now: u64,
    ) -> &mut Slot {
        // The entry holds its spec alive, so an equal address is the same
        // allocation, not a new one at a freed address.
        if !std::ptr::eq(Arc::as_ptr(&self.spec), spec) {
            self.adopt(spec, shared, now);
        }
        &mut self.state
    }

    /// [`Entry::current`] for a spec at another address.
    #[cold]
    fn adopt(&mut self, spec: &LimitSpec, shared: impl Fn() -> Arc<LimitSpec>, now: u64) {
        // The spec first: the state below is then replaced last, with
        // nothing after it that could leave the two out of step.
        let shared = shared();
        if self.spec.buckets.len() != spec.buckets.len() {
            // Other buckets start full; the slots held stay held, so the
            // concurrency limit still counts them until they are released,
            // and a penalty holds the new buckets until its end
            // (`state::adopt`).
            let adopted = state::adopt(self.state.take(), spec, now);
            self.state = Slot::Table(Stored::of(adopted, spec));
        } else if one_bucket(spec) != matches!(self.state.get(), Stored::One(_)) {
            // As many buckets, held the other way: the buckets are kept (a
            // one-bucket state keeps its live leases by staying full). A
            // pinned state is retired as it is read, so no decision through
            // its pin lands on it after.
            self.state = Slot::Table(Stored::of(self.state.take(), spec));
        }
        self.spec = shared;
    }
}

/// `spec` as a shared allocation: the one this thread made last if equal,
/// else a new one. New states of one resource so share one copy.
fn shared_spec(spec: &LimitSpec) -> Arc<LimitSpec> {
    thread_local! {
        static LAST: std::cell::RefCell<Option<Arc<LimitSpec>>> = const { std::cell::RefCell::new(None) };
    }
    LAST.try_with(|last| {
        let mut last = last.borrow_mut();
        match &*last {
            Some(s) if **s == *spec => s.clone(),
            _ => {
                let s = Arc::new(spec.clone());
                *last = Some(s.clone());
                s
            }
        }
    })
    // A call from another thread-local's destructor, once `LAST` is gone:
    // a copy of its own.
    .unwrap_or_else(|_| Arc::new(spec.clone()))
}

#[async_trait]
impl broker_core::Backend for MemoryBackend {
    async fn try_acquire(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Result<Decision, BackendError> {
        Ok(self.try_acquire_sync(key, spec, cost))
    }

    fn try_acquire_now(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Option<Result<Decision, BackendError>> {
        Some(Ok(self.try_acquire_sync(key, spec, cost)))
    }

    async fn reserve(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
        max_wait: Duration,
    ) -> Result<Reservation, BackendError> {
        let max_wait = micros(max_wait);
        Ok(self.with_state(key, spec, |s, now| {
            state::reserve(s, spec, now, cost, max_wait)
        }))
    }

    async fn hold_slot(
        &self,
        key: &str,
        spec: &LimitSpec,
    ) -> Result<Option<LeaseId>, BackendError> {
        Ok(self.hold_slot_sync(key, spec))
    }

    async fn hold_left(
        &self,
        key: &str,
        spec: &LimitSpec,
        cost: Cost,
    ) -> Result<Micros, BackendError> {
        Ok(self.with_state(key, spec, |s, now| state::hold_left(s, spec, now, cost)))
    }

    fn hold_slot_now(
        &self,
        key: &str,
        spec: &LimitSpec,
    ) -> Option<Result<Option<LeaseId>, BackendError>> {
        Some(Ok(self.hold_slot_sync(key, spec)))
    }

    async fn release(&self, key: &str, lease: LeaseId) -> Result<bool, BackendError> {
        Ok(self.release_sync(key, lease))
    }

    fn release_now(&self, key: &str, lease: LeaseId) -> Option<Result<bool, BackendError>> {
        Some(Ok(self.release_sync(key, lease)))
    }

    async fn renew(
        &self,
        key: &str,
        spec: &LimitSpec,
        lease: LeaseId,
    ) -> Result<bool, BackendError> {
        // A lease is renewed where it is held: a key with no state holds
        // none, and gets no state made for the question.
        Ok(key::with_parsed(key, |key| {
            self.store
                .with_existing(
                    key,
                    spec,
                    || shared_spec(spec),
                    |s, now| s.with_full(|s| state::renew(s, spec, now, lease)),
                )
                .unwrap_or(false)
        }))
    }

    async fn settle(
        &self,
        key: &str,
        spec: &LimitSpec,
        reserved: Cost,
        actual: Cost,
        since: Option<Marks>,
    ) -> Result<(), BackendError> {
        self.with_state(key, spec, |s, now| {
            state::settle(s, spec, now, reserved, actual, since)
        });
        Ok(())
    }

    fn settle_now(
        &self,
        key: &str,
        spec: &LimitSpec,
        reserved: Cost,
        actual: Cost,
        since: Option<Marks>,
    ) -> Option<Result<(), BackendError>> {
        self.with_state(key, spec, |s, now| {
            state::settle(s, spec, now, reserved, actual, since)
        });
        Some(Ok(()))
    }

    async fn penalize(
        &self,
        key: &str,
        spec: &LimitSpec,
        hold: Duration,
    ) -> Result<(), BackendError> {
        self.with_state(key, spec, |s, now| {
            state::penalize(s, spec, now, now.saturating_add(micros(hold)))
        });
        Ok(())
    }

    async fn reconcile(
        &self,
        key: &str,
        spec: &LimitSpec,
        observed: &ObservedLimit,
    ) -> Result<(), BackendError> {
        self.with_state(key, spec, |s, now| state::reconcile(s, spec, now, observed));
        Ok(())
    }

    fn local_states(
        &self,
        resource_key: &str,
        spec: Arc<LimitSpec>,
    ) -> Option<Arc<dyn LocalStates>> {
        Some(Arc::new(local::ResourceStates::new(
            self.store.clone(),
            resource_key,
            spec,
        )))
    }

    /// The store is in the process of every permit on it: a lease ends
    /// when its permit is released or dropped, however long it runs.
    fn leases_end_with_holders(&self) -> bool {
        true
    }
}

impl MemoryBackend {
    /// `hold_slot` on the joined state `key`: the lease, when held.
    fn hold_slot_sync(&self, key: &str, spec: &LimitSpec) -> Option<LeaseId> {
        let lease = self.lease();
        self.with_state(key, spec, |s, now| state::hold_slot(s, spec, now, lease))
            .then_some(lease)
    }

    fn release_sync(&self, key: &str, lease: LeaseId) -> bool {
        key::with_parsed(key, |key| self.store.release(key, lease))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lease ids from threads taking blocks of them at once, across block
    /// ends: never 0 (no lease), never one twice.
    #[test]
    fn lease_ids_are_unique_across_threads() {
        let ids: Vec<LeaseId> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..3_000).map(|_| next_lease()).collect::<Vec<_>>()))
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect()
        });
        let mut unique = ids.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ids.len());
        assert!(!ids.contains(&0));
    }

    /// A decision's reads of the store lie on two cache lines (see
    /// [`Store`]): the clock and the sweeper's counts on the first, the
    /// table's on the line [`States`] starts.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_decisions_reads_of_the_store_lie_on_two_lines() {
        use std::mem::{align_of, offset_of, size_of};
        assert_eq!(align_of::<Store>() % 64, 0);
        assert!(size_of::<StoreClock>() <= 48, "{}", size_of::<StoreClock>());
        let sweeper = offset_of!(Store, sweeper);
        assert!(sweeper + 2 * size_of::<usize>() <= 64, "{sweeper}");
        assert_eq!(offset_of!(Store, states) % 64, 0);
    }
}
