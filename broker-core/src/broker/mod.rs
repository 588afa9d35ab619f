//! The [`ResourceBroker`] facade: one object for both strategies.

mod enqueue;
mod first_poll;
mod handle;
mod hold;
mod in_flight;
mod keeper;
mod permit;
mod queue;
mod register;
mod target;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

pub use enqueue::{Attempt, EnqueueError};
use first_poll::{acquisition, denied, Call, FirstPoll, Later};
pub use first_poll::{TryAcquire, TryAcquireOnHandle};
pub use handle::ResourceHandle;
use permit::HeldKey;
pub use permit::{Acquisition, Permit};
pub use queue::{FlowStats, LevelStats, QueueStats};
pub use register::{EntryError, OnOtherLimits};
pub use target::{Priority, Target};

use crate::config::ResourceConfig;
use crate::error::{BackendError, BrokerError, ConfigError};
use crate::keys;
use crate::limits::{Cost, Limits};
use crate::observed::ObservedLimit;
use crate::state::{Decision, DenyReason, LimitSpec, Marks, Verdict};
use crate::stats::{bump, BrokerStats, Counters, ResourceKind, ResourceStats};
use crate::store::{LocalStates, Store};

/// One broker over one state store: `enqueue` (queue + execute) and
/// `try_acquire` / `acquire` (check + reject) on the same resources.
///
/// Cloning is cheap and shares everything.
///
/// ```
/// use broker_core::{Cost, Limits, RateLimit, ResourceBroker};
/// # async fn demo(backend: impl broker_core::Store) -> Result<(), broker_core::BrokerError> {
/// let broker = ResourceBroker::new(backend);
/// broker.register_limit("webhooks", Limits::new().rate(RateLimit::per_second(100)))?;
/// let a = broker.try_acquire("webhooks", Cost::default()).await?;
/// if !a.allowed {
///     println!("429, retry after {:?}", a.wait_time);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ResourceBroker {
    inner: Arc<Inner>,
}

/// Registered resources by id. Ids are chosen by the application (user
/// data goes into sub-keys, which the backend holds), so the registry uses a
/// fast hasher: it is read on every call.
type Registry = HashMap<String, Arc<Resource>, foldhash::fast::RandomState>;

struct Inner {
    backend: Arc<dyn Store>,
    resources: ArcSwap<Registry>,
    register: std::sync::Mutex<()>,
    /// Renews the leases of live permits, on a store whose leases expire.
    keeper: Option<Arc<keeper::Keeper>>,
}

/// A registered resource: its limits compiled once, its counters.
#[derive(Debug)]
pub(crate) struct Resource {
    /// The backend's states of this resource, when it answers without I/O
    /// (see [`LocalStore::states`](crate::LocalStore::states)).
    pub(crate) local: Option<Arc<dyn LocalStates>>,
    /// The largest cost of each unit that can ever fit (the smallest burst
    /// of the limits counting it): a cost within it passes
    /// `Limits::check_fits`.
    pub(crate) fits: Cost,
    /// How many calls are in `enqueue::wait_slot` now.
    slot_waiters: std::sync::atomic::AtomicUsize,
    /// The calls waiting and the work running (or permits held) under
    /// this id, shared by its registrations (a permit counts itself in
    /// flight here).
    pub(crate) live: Arc<crate::stats::Live>,
    /// Set once a registration under the same id replaced this resource:
    /// a [`ResourceHandle`] holding it then goes through the registry.
    pub(crate) retired: std::sync::atomic::AtomicBool,
    pub(crate) id: String,
    pub(crate) key: String,
    pub(crate) config: ResourceConfig,
    pub(crate) spec: Arc<LimitSpec>,
    pub(crate) kind: ResourceKind,
    pub(crate) counters: Counters,
    /// Wakes `enqueue` / `acquire` calls waiting for a concurrency slot;
    /// notified only while `slot_waiters` says someone waits.
    slot_notify: tokio::sync::Notify,
    /// Holds on attempts already booked in this process (see `hold.rs`),
    /// shared by every registration of this id.
    pub(crate) holds: Arc<hold::Holds>,
    /// The local wait queues of `enqueue`, by state key, shared by every
    /// registration of this id.
    pub(crate) lines: Arc<queue::Lines>,
    /// When this resource last logged a backend error at warn level (ms
    /// since the process-wide origin), `u64::MAX` for never.
    pub(crate) warned_at_ms: std::sync::atomic::AtomicU64,
    /// Renews the leases of this resource's live permits, on a store whose
    /// leases expire (see `keeper.rs`).
    pub(crate) keeper: Option<Arc<keeper::Keeper>>,
    /// The latest registration of this id, shared by all its
    /// registrations.
    pub(crate) lineage: Arc<Lineage>,
    /// This registration's changes of limits since the first of its id.
    pub(crate) epochs: Epochs,
}

/// What the registrations of one resource id share: the latest of them.
/// Each registration holds it, never the registrations after it, so one
/// kept alive by a call, a permit or a [`ResourceHandle`] made on it keeps
/// nothing else alive (before, it kept every later registration, and a
/// service that re-configured a resource every second grew without end).
#[derive(Debug)]
pub(crate) struct Lineage {
    latest: ArcSwap<Latest>,
}

/// The latest registration of an id, as an earlier one sees it.
#[derive(Debug)]
pub(crate) struct Latest {
    /// Its limits.
    pub(crate) spec: Arc<LimitSpec>,
    /// Its changes of limits since the first registration of the id.
    pub(crate) epochs: Epochs,
    /// The registration (the registry holds it), whose counters count
    /// what happens to a call made on an earlier one.
    resource: std::sync::Weak<Resource>,
}

/// How many registrations of an id, since its first, came with other
/// limits than the one before them (`limits`), and how many of those with
/// other buckets (`buckets`: other units, or another number of them).
/// Two registrations have the same limits (buckets) if and only if no
/// registration from the one to the other changed them: equal epochs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Epochs {
    pub(crate) limits: u64,
    pub(crate) buckets: u64,
}

impl Epochs {
    /// The epochs of a registration of `spec` made over one of `before`
    /// with these epochs.
    pub(crate) fn after(self, before: &Arc<LimitSpec>, spec: &Arc<LimitSpec>) -> Self {
        if Arc::ptr_eq(before, spec) || **before == **spec {
            return self;
        }
        Self {
            limits: self.limits + 1,
            buckets: self.buckets + u64::from(!enqueue::same_units(before, spec)),
        }
    }
}

impl Lineage {
    /// The lineage of a first registration, of `spec`, until
    /// [`Lineage::install`] names it.
    pub(crate) fn new(spec: Arc<LimitSpec>) -> Self {
        Self {
            latest: ArcSwap::from_pointee(Latest {
                spec,
                epochs: Epochs::default(),
                resource: std::sync::Weak::new(),
            }),
        }
    }

    /// Makes `resource` the latest registration of the id.
    pub(crate) fn install(&self, resource: &Arc<Resource>) {
        self.latest.store(Arc::new(Latest {
            spec: resource.spec.clone(),
            epochs: resource.epochs,
            resource: Arc::downgrade(resource),
        }));
    }
}

/// The registration whose counters count an event of a call (see
/// [`Resource::tally`]).
pub(crate) enum Tally<'r> {
    /// The registration the call was made on, still the latest.
    Own(&'r Resource),
    /// The latest, which replaced it.
    Latest(Arc<Resource>),
}

impl std::ops::Deref for Tally<'_> {
    type Target = Resource;

    fn deref(&self) -> &Resource {
        match self {
            Tally::Own(r) => r,
            Tally::Latest(r) => r,
        }
    }
}

impl Resource {
    /// The latest registration under this resource's id: its own, or that
    /// of the one that replaced it (and so on). A call that began under a
    /// replaced registration makes its later transitions (its refund, its
    /// settlement, a retry's booking, a penalty) with the latest limits: a
    /// store keeps a state for one set of limits, and one made for other
    /// buckets starts afresh (but for a penalty, see
    /// [`crate::state::adopt`]), so transitions under two sets in turn
    /// would start it afresh again and again.
    pub(crate) fn latest(&self) -> Arc<Latest> {
        self.lineage.latest.load_full()
    }

    /// The registration whose counters count what happens now to a call
    /// made on this one: itself, or, once a registration replaced it, the
    /// latest, so that the stats the broker reports (those of the latest)
    /// count every event after it, as the metrics (by id) do.
    pub(crate) fn tally(&self) -> Tally<'_> {
        if !self.retired.load(std::sync::atomic::Ordering::Acquire) {
            return Tally::Own(self);
        }
        match self.lineage.latest.load().resource.upgrade() {
            Some(latest) => Tally::Latest(latest),
            None => Tally::Own(self),
        }
    }

    /// The counters of this registration; `queued` and `in_flight` count
    /// the calls waiting and the work running (or permits held) on every
    /// registration of the id, also on one this one replaced: those are
    /// still queued and in flight under this id.
    fn stats(&self) -> ResourceStats {
        ResourceStats {
            queue: self.lines.stats(),
            ..self.counters.snapshot(self.kind, &self.live)
        }
    }

    /// `config.limits.check_fits`, answered from `fits` when it passes.
    pub(crate) fn check_fits(&self, cost: Cost) -> Result<(), BrokerError> {
        if self.fits(cost) {
            return Ok(());
        }
        self.check_fits_slow(cost)
    }

    /// Whether `cost` passes `config.limits.check_fits`.
    pub(crate) fn fits(&self, cost: Cost) -> bool {
        cost.requests <= self.fits.requests && cost.tokens <= self.fits.tokens
    }

    fn check_fits_slow(&self, cost: Cost) -> Result<(), BrokerError> {
        self.config.limits.check_fits(&self.id, cost)
    }
}

/// Waiting for a freed concurrency slot. A waiter is counted before its
/// first attempt to take a slot, so a release either happens before that
/// attempt (which then sees the free slot) or sees the count and notifies.
impl Resource {
    /// After a slot was released: wakes the waiters, if any (the common
    /// case, none, costs one atomic load instead of the notifier's lock).
    pub(crate) fn slot_freed(&self) {
        if self.slot_waiters.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            self.slot_notify.notify_waiters();
        }
    }

    /// Counts the caller as a slot waiter until the guard is dropped.
    pub(crate) fn wait_for_slots(&self) -> SlotWaiter<'_> {
        self.slot_waiters
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        SlotWaiter(self)
    }

    /// A future that completes at the next [`Resource::slot_freed`] with
    /// waiters.
    pub(crate) fn slot_notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.slot_notify.notified()
    }
}

/// A counted slot waiter (see [`Resource::wait_for_slots`]).
pub(crate) struct SlotWaiter<'r>(&'r Resource);

impl Drop for SlotWaiter<'_> {
    fn drop(&mut self) {
        self.0
            .slot_waiters
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The largest cost of each unit that `limits` can ever grant.
fn largest_fit(limits: &Limits) -> Cost {
    let smallest = |unit| {
        limits
            .rates
            .iter()
            .filter(|r| r.unit == unit)
            .map(|r| r.burst())
            .min()
            .unwrap_or(u64::MAX)
    };
    Cost {
        requests: smallest(crate::limits::Unit::Requests),
        tokens: smallest(crate::limits::Unit::Tokens),
    }
}

/// A resource logs a backend error at warn level at most once per this
/// many milliseconds; the rest go to debug level. During an outage every
/// call fails, and the backend already logs the outage once.
const BACKEND_WARN_INTERVAL_MS: u64 = 10_000;

pub(crate) fn note_backend_error(resource: &Resource, op: &'static str, e: &BackendError) {
    use std::sync::atomic::Ordering;
    bump(&resource.tally().counters.backend_errors);
    crate::telemetry::backend_error(&resource.id, op);
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let now_ms = ORIGIN
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64;
    let last = resource.warned_at_ms.load(Ordering::Relaxed);
    let due = last == u64::MAX || now_ms.saturating_sub(last) >= BACKEND_WARN_INTERVAL_MS;
    if due
        && resource
            .warned_at_ms
            .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(resource = %resource.id, op, error = %e.message, "backend error");
    } else {
        tracing::debug!(resource = %resource.id, op, error = %e.message, "backend error");
    }
}

impl std::fmt::Debug for ResourceBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceBroker")
            .field("resources", &self.inner.resources.load().len())
            .finish()
    }
}

/// # Construction and registration
impl ResourceBroker {
    /// A broker over `backend` (e.g. `MemoryBackend::new()` or a
    /// `RedisBackend`).
    pub fn new(backend: impl Store) -> Self {
        Self::from_arc(Arc::new(backend))
    }

    /// A broker over a shared backend.
    pub fn from_arc(backend: Arc<dyn Store>) -> Self {
        let keeper = backend
            .local()
            .is_none()
            .then(|| Arc::new(keeper::Keeper::new(backend.clone())));
        Self {
            inner: Arc::new(Inner {
                keeper,
                backend,
                resources: ArcSwap::from_pointee(Registry::default()),
                register: std::sync::Mutex::new(()),
            }),
        }
    }

    /// The state store.
    pub fn backend(&self) -> &Arc<dyn Store> {
        &self.inner.backend
    }

    /// Registers (or re-configures) a resource for `enqueue` and
    /// `try_acquire`.
    pub fn register(&self, resource: &str, config: ResourceConfig) -> Result<(), ConfigError> {
        self.insert(resource, config, ResourceKind::Queue)
    }

    /// Registers (or re-configures) a limit-only resource for `try_acquire`
    /// and `acquire` (no queue configured). `enqueue` on it still queues,
    /// with the queue capacity and retry policy of [`ResourceConfig::new`]
    /// (the same limits, one state): register it with
    /// [`ResourceBroker::register`] to choose them.
    pub fn register_limit(&self, resource: &str, limits: Limits) -> Result<(), ConfigError> {
        self.insert(
            resource,
            ResourceConfig::new(limits),
            ResourceKind::LimitOnly,
        )
    }

    /// Whether `resource` is registered.
    pub fn is_registered(&self, resource: &str) -> bool {
        self.inner.resources.load().contains_key(resource)
    }

    pub(crate) fn resource(&self, id: &str) -> Result<Arc<Resource>, BrokerError> {
        self.inner
            .resources
            .load()
            .get(id)
            .cloned()
            .ok_or_else(|| BrokerError::UnknownResource(id.to_owned()))
    }

    /// The limits a resource was registered with.
    pub fn limits(&self, resource: &str) -> Result<Limits, BrokerError> {
        Ok(self.resource(resource)?.config.limits.clone())
    }

    /// How a resource was registered: with [`ResourceBroker::register`]
    /// (a queue) or [`ResourceBroker::register_limit`] (limit-only).
    pub fn kind(&self, resource: &str) -> Result<ResourceKind, BrokerError> {
        Ok(self.resource(resource)?.kind)
    }
}

fn state_key(resource: &Resource, key: Option<&str>) -> Option<String> {
    key.map(|k| keys::keyed(&resource.id, k))
}

/// `try_acquire` on a resource by id, as its future holds it.
struct ById<'s> {
    broker: &'s ResourceBroker,
    target: Target<'s>,
    cost: Cost,
}

impl<'s> Call<'s> for ById<'s> {
    fn quick(&self, permit: &mut Permit) -> Option<Verdict> {
        self.broker.quick_by_id(self.target, self.cost, permit)
    }

    fn start(self) -> Result<Result<Acquisition, BrokerError>, Later<'s>> {
        let (broker, cost) = (self.broker, self.cost);
        let mut state_key = None;
        broker
            .now_or_later(self.target, cost, &mut state_key)
            .map_err(|resource| {
                Box::pin(broker.try_acquire_later(resource, state_key, cost)) as Later<'s>
            })
    }
}

/// # Check + reject
impl ResourceBroker {
    /// Answers at once: takes `cost` (and a concurrency slot) if available,
    /// else says how long until it would fit. Nothing is consumed when
    /// denied. Dropped before it answers (a caller's timeout while a shared
    /// store is slow), it consumes nothing either: a decision already sent
    /// runs to its answer on a task of its own, which gives back what it
    /// took.
    pub fn try_acquire<'s, 'a: 's>(
        &'s self,
        target: impl Into<Target<'a>>,
        cost: Cost,
    ) -> TryAcquire<'s> {
        TryAcquire(FirstPoll::new(ById {
            broker: self,
            target: target.into(),
            cost,
        }))
    }

    /// [`ResourceBroker::try_acquire`] without waiting, for callers that
    /// can use a synchronous answer (a tower service answering in `call`):
    /// `Some(answer)` when the backend answered without I/O (the in-memory
    /// store), `None` when it must be asked asynchronously; then nothing
    /// was consumed, and `try_acquire` is the call to make.
    ///
    /// ```
    /// use broker_core::{Cost, Limits, RateLimit, ResourceBroker};
    /// # fn demo(backend: impl broker_core::Store) -> Result<(), broker_core::BrokerError> {
    /// let broker = ResourceBroker::new(backend);
    /// broker.register_limit("webhooks", Limits::new().rate(RateLimit::per_second(100)))?;
    /// match broker.try_acquire_now("webhooks", Cost::default()) {
    ///     Some(answer) => println!("allowed: {}", answer?.allowed),
    ///     None => println!("ask with try_acquire(..).await"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_acquire_now<'a>(
        &self,
        target: impl Into<Target<'a>>,
        cost: Cost,
    ) -> Option<Result<Acquisition, BrokerError>> {
        let target = target.into();
        let mut permit = Permit::empty();
        if let Some(v) = self.quick_by_id(target, cost, &mut permit) {
            return Some(Ok(acquisition(v, permit)));
        }
        self.try_acquire_now_in_full(target, cost)
    }

    /// [`ResourceBroker::try_acquire_now`] past its common case, out of
    /// the callers' line.
    fn try_acquire_now_in_full(
        &self,
        target: Target<'_>,
        cost: Cost,
    ) -> Option<Result<Acquisition, BrokerError>> {
        self.now_or_later(target, cost, &mut None).ok()
    }

    /// [`ResourceBroker::quick`] on the resource `target` names, if it is
    /// registered.
    fn quick_by_id(&self, target: Target<'_>, cost: Cost, permit: &mut Permit) -> Option<Verdict> {
        let registry = self.inner.resources.load();
        self.quick(registry.get(target.resource)?, target.key, cost, permit)
    }

    /// The common case of `try_acquire`, kept short: a store that answers
    /// without I/O, a cost that fits. The verdict is counted, and the slot
    /// of a [`Verdict::Leased`] put in `permit`. Else `None`, with nothing
    /// consumed, and [`ResourceBroker::acquire_now`] makes the answer (or
    /// the error).
    fn quick(
        &self,
        resource: &Arc<Resource>,
        key: Option<&str>,
        cost: Cost,
        permit: &mut Permit,
    ) -> Option<Verdict> {
        let local = resource.local.as_ref()?;
        if !resource.fits(cost) {
            return None;
        }
        let v = local.try_acquire(key, cost).verdict();
        let counters = &resource.counters;
        Some(self.judge(resource, counters, || HeldKey::sub(key), v, permit))
    }

    /// The answer given without I/O, or the resource whose backend must be
    /// asked asynchronously, with `later` set to the state key to ask for.
    fn now_or_later(
        &self,
        target: Target<'_>,
        cost: Cost,
        later: &mut Option<String>,
    ) -> Result<Result<Acquisition, BrokerError>, Arc<Resource>> {
        let registry = self.inner.resources.load();
        let Some(resource) = registry.get(target.resource) else {
            return Ok(Err(BrokerError::UnknownResource(
                target.resource.to_owned(),
            )));
        };
        self.acquire_now(resource, target.key, cost, later)
            .ok_or_else(|| resource.clone())
    }

    /// `try_acquire` on a resource already looked up, without I/O; else
    /// `None` (nothing was consumed), with `later` set to the state key of
    /// sub-key `key` (`None`: the resource's own) for the backend's
    /// asynchronous call. The answer is returned as the callers return it,
    /// so it is written once, in place.
    fn acquire_now(
        &self,
        resource: &Arc<Resource>,
        key: Option<&str>,
        cost: Cost,
        later: &mut Option<String>,
    ) -> Option<Result<Acquisition, BrokerError>> {
        if let Err(e) = resource.check_fits(cost) {
            return Some(Err(e));
        }
        // A store that answers in process: the one in-process decision.
        let mut permit = Permit::empty();
        if let Some(v) = self.quick(resource, key, cost, &mut permit) {
            return Some(Ok(acquisition(v, permit)));
        }
        // Any other store is asked by state key, built once for both calls.
        let owned = state_key(resource, key);
        let state = owned.as_deref().unwrap_or(&resource.key);
        let local = self.inner.backend.local();
        let Some(decision) = local.and_then(|l| l.try_acquire_now(state, &resource.spec, cost))
        else {
            *later = owned;
            return None;
        };
        Some(match decision {
            Ok(d) => Ok(self.answer(resource, &resource.counters, || HeldKey::State(owned), d)),
            Err(e) => {
                note_backend_error(resource, "try_acquire", &e);
                Err(e.into())
            }
        })
    }

    /// `try_acquire` through the backend's asynchronous call.
    async fn try_acquire_later(
        &self,
        resource: Arc<Resource>,
        owned_key: Option<String>,
        cost: Cost,
    ) -> Result<Acquisition, BrokerError> {
        let backend = self.inner.backend.clone();
        let asked = resource.clone();
        // Run to its answer if the caller goes away meanwhile: a decision
        // that took a cost or a slot then gives them back, unclaimed.
        let decided = in_flight::to_its_answer(async move {
            let key = owned_key.as_deref().unwrap_or(&asked.key);
            let held_until = asked.holds.until(key);
            let decision = backend
                .try_acquire(key, &asked.spec, cost)
                .await
                .inspect_err(|e| note_backend_error(&asked, "try_acquire", e))?;
            let unclaimed =
                in_flight::Unclaimed::new(decision, backend, asked, owned_key, cost, held_until);
            Ok::<_, BackendError>(unclaimed)
        });
        let (decision, owned_key) = decided.await?.claim();
        // Counted on the latest registration: one may have replaced this
        // one while the store decided.
        let tally = resource.tally();
        let key = || HeldKey::State(owned_key);
        Ok(self.answer(&resource, &tally.counters, key, decision))
    }

    /// The acquisition of the store's decision `d`, counted in `counters`;
    /// `key` names the state a held lease is released on (made only when a
    /// lease is held).
    fn answer(
        &self,
        resource: &Arc<Resource>,
        counters: &Counters,
        key: impl FnOnce() -> HeldKey,
        d: Decision,
    ) -> Acquisition {
        let mut permit = Permit::empty();
        let v = self.judge(resource, counters, key, d.into(), &mut permit);
        Acquisition {
            answered_here: d.answered_here,
            ..acquisition(v, permit)
        }
    }

    /// Counts verdict `v` in `counters` (the resource's, or those of the
    /// registration that replaced it) and returns it, with the slot of a
    /// [`Verdict::Leased`] put in `permit` (`key` names the state it is
    /// released on, made only then).
    fn judge(
        &self,
        resource: &Arc<Resource>,
        counters: &Counters,
        key: impl FnOnce() -> HeldKey,
        v: Verdict,
        permit: &mut Permit,
    ) -> Verdict {
        match v {
            Verdict::Allowed => bump(&counters.allowed),
            Verdict::Leased(lease) => {
                bump(&counters.allowed);
                *permit = Permit::held(&self.inner.backend, resource.clone(), key(), lease, true);
            }
            Verdict::Rate(_) | Verdict::Concurrency => bump(&counters.denied),
        }
        v
    }

    /// Waits up to `max_wait` for `cost`, then answers: the cost is booked
    /// if it fits within `max_wait` (so waiters are spaced in order), else
    /// denied at once with the wait time, booking nothing.
    pub async fn acquire<'a>(
        &self,
        target: impl Into<Target<'a>>,
        cost: Cost,
        max_wait: Duration,
    ) -> Result<Acquisition, BrokerError> {
        let target = target.into();
        let resource = self.resource(target.resource)?;
        resource.config.limits.check_fits(&resource.id, cost)?;
        let owned_key = state_key(&resource, target.key);
        let state = match &owned_key {
            Some(key) => (key.as_str(), true),
            None => (resource.key.as_str(), false),
        };
        let bounds = enqueue::Bounds {
            deadline: Some((crate::clock::tokio_after(max_wait), max_wait)),
            ceiling: None,
        };
        let (booking, permit) =
            match enqueue::admit_until(self, &resource, state, cost, &bounds, None, true).await? {
                enqueue::Admitted::Go(booking, permit) => (booking, permit),
                enqueue::Admitted::TooLong(wait, _) => {
                    bump(&resource.tally().counters.denied);
                    return Ok(denied(DenyReason::Rate, wait));
                }
                enqueue::Admitted::NoSlot(_) => {
                    bump(&resource.tally().counters.denied);
                    return Ok(denied(DenyReason::Concurrency, 0));
                }
            };
        let booked = booking.consume();
        bump(&resource.tally().counters.allowed);
        Ok(Acquisition {
            answered_here: booked.answered_here(),
            ..acquisition(Verdict::Allowed, permit)
        })
    }
}

/// # Upstream feedback
impl ResourceBroker {
    /// `penalize`: after a real upstream 429, drain the resource's buckets
    /// and hold them for `hold` (a resource without rate limits: hold its
    /// state in the store, see [`crate::state::penalize`]). Never shortens
    /// a longer penalty. Counted as an upstream 429 in
    /// [`ResourceBroker::stats`]. Call it before the permit of the call
    /// that got the 429 is dropped: on a resource without rate limits, a
    /// call of another process waiting for the slot would otherwise take
    /// it before the store holds the penalty.
    pub async fn penalize<'a>(
        &self,
        target: impl Into<Target<'a>>,
        hold: Duration,
    ) -> Result<(), BrokerError> {
        let target = target.into();
        let resource = self.resource(target.resource)?;
        bump(&resource.counters.upstream_429);
        crate::telemetry::count(&resource.id, crate::telemetry::Signal::Upstream429);
        let owned = state_key(&resource, target.key);
        let key = owned.as_deref().unwrap_or(&resource.key);
        resource.holds.hold(key, crate::clock::tokio_after(hold));
        self.inner
            .backend
            .penalize(key, &resource.spec, hold)
            .await
            .inspect_err(|e| note_backend_error(&resource, "penalize", e))?;
        Ok(())
    }

    /// `reconcile`: narrow the resource's buckets to what the upstream's
    /// headers say remains. Skipped without a backend call when nothing is
    /// narrower than the configured capacity. A reset longer than the
    /// resource's wait ceiling holds for the ceiling only. An observed
    /// limit other than the configured one is logged at debug level, never
    /// applied. A resource without rate limits has no bucket to narrow: a
    /// spent counter (`remaining` 0) holds it in the store until its reset,
    /// as [`ResourceBroker::penalize`] does, without counting a 429; call
    /// it, as `penalize`, before the permit of the call whose answer it
    /// reads is dropped.
    pub async fn reconcile<'a>(
        &self,
        target: impl Into<Target<'a>>,
        observed: &ObservedLimit,
    ) -> Result<(), BrokerError> {
        let target = target.into();
        let resource = self.resource(target.resource)?;
        let owned = state_key(&resource, target.key);
        let key = owned.as_deref().unwrap_or(&resource.key);
        self.reconcile_key(&resource, key, observed).await
    }

    /// `settle`: correct a charge after the work, from `reserved` to
    /// `actual` (refund or charge the difference). A refund is not made
    /// while a hold is on (a penalty or an exhausted upstream counter drained
    /// what it would give back).
    ///
    /// The correction goes to the store as it is now. A cost a shared
    /// store's failure policy answered while the store was out of reach (a
    /// `try_acquire` let through open, or taken by the local fallback) was
    /// never in the store, and a refund of it made once the store is back
    /// would give the store tokens no call took: this call cannot tell such
    /// a cost apart; [`ResourceBroker::settle_since`] with the
    /// acquisition's [`Acquisition::settle_marks`] settles it where it
    /// went. `enqueue` settles its own bookings where their cost went.
    pub async fn settle<'a>(
        &self,
        target: impl Into<Target<'a>>,
        reserved: Cost,
        actual: Cost,
    ) -> Result<(), BrokerError> {
        self.settle_since(target, reserved, actual, None).await
    }

    /// [`ResourceBroker::settle`], told where the cost went: `since` are the
    /// marks of the booking settled ([`crate::Reservation::since`]), or
    /// those of an acquisition ([`Acquisition::settle_marks`]):
    /// [`Marks::ANSWERED_HERE`] for a cost the store's failure policy
    /// answered while the store was out of reach, which is then settled
    /// where it went (this process's fallback bucket, or nowhere), not in
    /// the store.
    ///
    /// ```
    /// # use broker_core::{Cost, ResourceBroker};
    /// # async fn refund(broker: &ResourceBroker) -> Result<(), broker_core::BrokerError> {
    /// let taken = broker.try_acquire("webhooks", Cost::requests(1)).await?;
    /// // Admitted, then refused further on: the cost goes back where it
    /// // was taken.
    /// broker
    ///     .settle_since("webhooks", Cost::requests(1), Cost::requests(0), taken.settle_marks())
    ///     .await
    /// # }
    /// ```
    pub async fn settle_since<'a>(
        &self,
        target: impl Into<Target<'a>>,
        reserved: Cost,
        actual: Cost,
        since: Option<Marks>,
    ) -> Result<(), BrokerError> {
        let target = target.into();
        let resource = self.resource(target.resource)?;
        let owned = state_key(&resource, target.key);
        let key = owned.as_deref().unwrap_or(&resource.key);
        self.inner
            .backend
            .settle(key, &resource.spec, reserved, actual, since)
            .await
            .inspect_err(|e| note_backend_error(&resource, "settle", e))?;
        Ok(())
    }
}

/// # Observability
impl ResourceBroker {
    /// Counters of every resource, and the state store's health (calls
    /// answered by its failure policy while it was unreachable). A
    /// resource's counts start at its latest registration (what happens
    /// since to a call made on a registration it replaced included, as in
    /// the metrics), save `queued` and `in_flight`, which also count the
    /// calls and permits still running on a registration it replaced.
    pub fn stats(&self) -> BrokerStats {
        let resources = self
            .inner
            .resources
            .load()
            .values()
            .map(|r| (r.id.clone(), r.stats()))
            .collect();
        BrokerStats {
            resources,
            backend: self.inner.backend.health(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{RateLimit, Unit};
    use crate::state::Decision;
    use proptest::prelude::*;

    #[derive(Debug)]
    struct NoStore;

    #[async_trait::async_trait]
    impl Store for NoStore {
        async fn try_acquire(
            &self,
            _: &str,
            _: &LimitSpec,
            _: Cost,
        ) -> Result<Decision, BackendError> {
            Err(BackendError::new("unused"))
        }
        async fn reserve(
            &self,
            _: &str,
            _: &LimitSpec,
            _: Cost,
            _: Duration,
        ) -> Result<crate::state::Reservation, BackendError> {
            Err(BackendError::new("unused"))
        }
        async fn take_slot(
            &self,
            _: &str,
            _: &LimitSpec,
        ) -> Result<Option<crate::state::LeaseId>, BackendError> {
            Err(BackendError::new("unused"))
        }
        async fn release(&self, _: &str, _: crate::state::LeaseId) -> Result<bool, BackendError> {
            Err(BackendError::new("unused"))
        }
        async fn settle(
            &self,
            _: &str,
            _: &LimitSpec,
            _: Cost,
            _: Cost,
            _: Option<crate::state::Marks>,
        ) -> Result<(), BackendError> {
            Err(BackendError::new("unused"))
        }
        async fn penalize(&self, _: &str, _: &LimitSpec, _: Duration) -> Result<(), BackendError> {
            Err(BackendError::new("unused"))
        }
        async fn reconcile(
            &self,
            _: &str,
            _: &LimitSpec,
            _: &ObservedLimit,
        ) -> Result<(), BackendError> {
            Err(BackendError::new("unused"))
        }
    }

    /// A service that re-configures a resource again and again (a config
    /// reload every second for a day) while something made on its first
    /// registration lives on (a layer's [`ResourceHandle`], a long-held
    /// permit, a thread's kept registry) keeps that one and the latest
    /// alive, not every registration in between.
    #[test]
    fn re_registrations_are_not_kept_alive_by_an_old_one() {
        let broker = ResourceBroker::new(NoStore);
        let limits = |n| Limits::new().rate(RateLimit::per_second(n));
        broker.register_limit("r", limits(1)).unwrap();
        let first = broker.resource_handle("r").unwrap();
        let registrations: Vec<_> = (0..10_000u64)
            .map(|i| {
                broker.register_limit("r", limits(2 + i % 2)).unwrap();
                Arc::downgrade(&broker.resource("r").unwrap())
            })
            .collect();
        let alive = registrations
            .iter()
            .filter(|r| r.strong_count() > 0)
            .count();
        assert_eq!(alive, 1, "only the latest, besides the first");
        assert!(!first.is_current());
    }

    proptest! {
        /// The precomputed fit check accepts and refuses exactly the costs
        /// `Limits::check_fits` does, with the same error.
        #[test]
        fn fast_fit_check_equals_check_fits(
            rates in prop::collection::vec((1u64..100, any::<bool>()), 0..4),
            requests in 0u64..120,
            tokens in 0u64..120,
        ) {
            let mut limits = Limits::new();
            for (burst, tokens) in rates {
                let unit = if tokens { Unit::Tokens } else { Unit::Requests };
                limits = limits.rate(RateLimit::per_second(burst).unit(unit));
            }
            let broker = ResourceBroker::new(NoStore);
            broker.register_limit("r", limits.clone()).unwrap();
            let resource = broker.resource("r").unwrap();
            let cost = Cost { requests, tokens };
            let fast = resource.check_fits(cost).map_err(|e| e.to_string());
            let slow = limits.check_fits("r", cost).map_err(|e| e.to_string());
            prop_assert_eq!(fast, slow);
        }
    }
}
