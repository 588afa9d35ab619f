//! The state of one resource (all its buckets and concurrency leases) and
//! the transitions over all limits at once: all limits pass or nothing is
//! consumed. Pure functions; backends call them (memory) or mirror them (Lua).

use serde::{Deserialize, Serialize};

use super::bucket::{self, BucketParams, BucketState, Shortfall};
use super::limits::{Cost, Limits, Unit};
use super::observed::ObservedLimit;
use super::time::{micros, Micros};
pub use super::verdict::{Decision, DenyReason, LeaseId, LocalVerdict, RefillTime, Verdict};

/// Limits compiled for the state machine: one bucket per rate limit, plus
/// the concurrency limit and how long a lease lives if never released.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitSpec {
    /// One entry per rate limit, in the order of [`Limits::rates`].
    pub buckets: Vec<(Unit, BucketParams)>,
    /// At most this many leases at once.
    pub max_concurrent: Option<u32>,
    /// A lease not released within this time expires (its holder died).
    pub lease_ttl: Micros,
}

impl LimitSpec {
    /// Compiles validated limits.
    pub fn new(limits: &Limits, lease_ttl: std::time::Duration) -> Self {
        Self {
            buckets: limits.rates.iter().map(|r| (r.unit, r.params())).collect(),
            max_concurrent: limits.max_concurrent,
            lease_ttl: micros(lease_ttl),
        }
    }

    /// True if no observed counter is narrower than its bucket's capacity:
    /// then [`reconcile`] would change nothing and the call can be skipped.
    pub fn reconcile_is_noop(&self, observed: &ObservedLimit) -> bool {
        self.buckets.iter().enumerate().all(|(i, (_, p))| {
            observed_for(self, observed, i)
                .and_then(|o| o.remaining)
                .is_none_or(|r| r as f64 >= p.capacity())
        })
    }
}

/// A held concurrency slot and when it expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The lease id.
    pub id: LeaseId,
    /// When it expires if not released.
    pub expires: Micros,
}

/// The state of one resource key.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceState {
    /// One bucket per rate limit, aligned with [`LimitSpec::buckets`].
    pub buckets: Vec<BucketState>,
    /// Held concurrency slots.
    pub leases: Vec<Lease>,
    /// The end of a penalty on a resource without rate limits (no bucket
    /// to hold): until then every cost is denied by rate, and a booking
    /// waits for it. Set by [`penalize`] only when [`LimitSpec::buckets`]
    /// is empty, and read only then: with rate limits, each bucket's `nb`
    /// holds the resource, and this stays 0. 0 when none was set.
    pub hold: Micros,
}

impl ResourceState {
    /// Full buckets and no leases, as of `now`.
    pub fn fresh(spec: &LimitSpec, now: Micros) -> Self {
        Self {
            buckets: spec
                .buckets
                .iter()
                .map(|(_, p)| BucketState::fresh(p, now))
                .collect(),
            leases: Vec::new(),
            hold: 0,
        }
    }
}

/// The answer of `reserve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// How long after now the booked cost may be used.
    pub wait: Micros,
    /// False when the wait exceeded `max_wait` and nothing was booked.
    pub booked: bool,
    /// The booking's marks on the store's clock, one per bucket, for a
    /// settlement of this reservation (`settle`'s `since`).
    pub since: Marks,
}

/// How many buckets of a booking have a mark of their own in [`Marks`].
pub const MARKED: usize = 4;

/// A booking's marks, one per bucket: the store's now at the booking, or,
/// for a bucket the cost is charged to, the end of the hold the bucket was
/// under then if later. A bucket held past its mark was held after the
/// booking (a hold never shortens `nb`). Buckets from the fourth on share
/// the fourth mark, the earliest of theirs. With them, the booking's `due`
/// time: when its cost is used, on the store's clock.
///
/// ```
/// use broker_core::state::Marks;
/// let m = Marks::new(1_000, [1_000, 5_000]).due_at(6_000);
/// assert_eq!((m.of(0), m.of(1), m.of(2), m.due()), (1_000, 5_000, 1_000, 6_000));
/// assert_eq!((Marks::uniform(7).of(9), Marks::uniform(7).due()), (7, 7));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marks {
    marks: [Micros; MARKED],
    due: Micros,
}

impl Marks {
    /// The marks of a booking a store's failure policy answered outside the
    /// store (its local fallback, or no store at all) while the store was
    /// out of reach: a time no store gives. The store settles such a
    /// booking where its cost went, and the broker passes these marks on
    /// whatever the limits are now.
    pub const ANSWERED_HERE: Self = Self {
        marks: [Micros::MAX; MARKED],
        due: Micros::MAX,
    };

    /// The same mark for every bucket: a booking at `at` under no hold,
    /// due at once.
    pub fn uniform(at: Micros) -> Self {
        Self {
            marks: [at; MARKED],
            due: at,
        }
    }

    /// The marks of buckets `0, 1, ...` in order, as of `now` (a bucket
    /// past the last given has `now`), due at `now`.
    pub fn new(now: Micros, marks: impl IntoIterator<Item = Micros>) -> Self {
        let mut out = [now; MARKED];
        for (i, m) in marks.into_iter().enumerate() {
            match out.get_mut(i) {
                Some(slot) => *slot = m,
                None => out[MARKED - 1] = out[MARKED - 1].min(m),
            }
        }
        Self {
            marks: out,
            due: now,
        }
    }

    /// These marks, of a booking due at `due` on the store's clock.
    pub fn due_at(self, due: Micros) -> Self {
        Self { due, ..self }
    }

    /// Bucket `i`'s mark.
    pub fn of(&self, i: usize) -> Micros {
        self.marks[i.min(MARKED - 1)]
    }

    /// When the booking's cost is used, on the store's clock (`settle`
    /// gives back only what no later booking was granted).
    pub fn due(&self) -> Micros {
        self.due
    }
}

fn costs(spec: &LimitSpec, cost: Cost) -> impl Iterator<Item = f64> + '_ {
    spec.buckets.iter().map(move |(u, _)| cost.of(*u) as f64)
}

fn purge_expired(leases: &mut Vec<Lease>, now: Micros) {
    leases.retain(|l| l.expires > now);
}

/// The longest wait among the buckets for `cost` at `now`, changing nothing.
/// A resource without rate limits waits for its [`ResourceState::hold`]
/// alone, whatever the cost.
pub fn wait_all(state: &ResourceState, spec: &LimitSpec, now: Micros, cost: Cost) -> Micros {
    if spec.buckets.is_empty() {
        return state.hold.saturating_sub(now);
    }
    let mut wait = 0;
    for (((_, p), c), s) in spec
        .buckets
        .iter()
        .zip(costs(spec, cost))
        .zip(&state.buckets)
    {
        if c > 0.0 {
            let now = now.max(s.ts);
            wait = wait.max(bucket::wait_for(&bucket::refill(*s, p, now), p, now, c));
        }
    }
    wait
}

/// `hold_left`: how long, from `now`, a call of `cost` is still held by a
/// 429's penalty or a spent counter's hold (see [`penalize`] and
/// [`reconcile`]), whatever the tokens: the latest not-before of the
/// buckets the cost draws on, each read from its own time as
/// [`wait_all`] reads it, or, without rate limits, the time left of the
/// [`ResourceState::hold`]; 0 for none. Changes nothing. A call booked
/// before the hold came, asked once its booked time has come, finds the
/// hold here where the booking did not wait for it.
pub fn hold_left(state: &ResourceState, spec: &LimitSpec, now: Micros, cost: Cost) -> Micros {
    if spec.buckets.is_empty() {
        return state.hold.saturating_sub(now);
    }
    costs(spec, cost)
        .zip(&state.buckets)
        .filter(|(c, _)| *c > 0.0)
        .map(|(_, s)| s.nb.saturating_sub(now.max(s.ts)))
        .max()
        .unwrap_or(0)
}

/// Books `cost` in every bucket for the same send time, `wait` after now.
fn book_all(state: &mut ResourceState, spec: &LimitSpec, now: Micros, cost: Cost, wait: Micros) {
    for (((_, p), c), s) in spec
        .buckets
        .iter()
        .zip(costs(spec, cost))
        .zip(&mut state.buckets)
    {
        if c > 0.0 {
            *s = bucket::book(*s, p, now, c, wait);
        }
    }
}

/// `try` over all limits: takes `cost` from every bucket and, if the
/// resource has a concurrency limit, a slot under `lease`, or nothing at all.
/// A zero cost for a bucket skips that bucket. A resource without rate
/// limits is denied by rate while its [`ResourceState::hold`] lasts, with
/// the wait to its end (see [`wait_all`]).
pub fn try_acquire(
    state: &mut ResourceState,
    spec: &LimitSpec,
    now: Micros,
    cost: Cost,
    lease: LeaseId,
) -> Decision {
    let ([(unit, p)], [s]) = (spec.buckets.as_slice(), state.buckets.as_slice()) else {
        return try_acquire_in_two_passes(state, spec, now, cost, lease);
    };
    // One rate limit (the common case): what `wait_all` then `take_all`
    // compute, with the bucket refilled once.
    let taken = match take_one(*s, p, now, cost.of(*unit) as f64) {
        Ok(taken) => taken,
        Err(wait) => return Decision::deny(DenyReason::Rate, wait),
    };
    if !hold_slot(state, spec, now, lease) {
        return Decision::deny(DenyReason::Concurrency, 0);
    }
    state.buckets[0] = taken;
    Decision::allow(spec.max_concurrent.map(|_| lease))
}

/// [`try_acquire`] for a resource of one rate limit and no concurrency
/// limit, on its one bucket: the same decision and the same new bucket,
/// with a denial's wait left unrounded. A caller deciding under a lock
/// rounds it ([`Shortfall::micros`]) after releasing the lock.
pub fn try_take_one(
    bucket: &mut BucketState,
    unit: Unit,
    params: &BucketParams,
    now: Micros,
    cost: Cost,
) -> Result<(), Shortfall> {
    take(bucket, params, now, cost.of(unit) as f64)
}

/// One bucket's part of `try`: takes `c` from the bucket, or leaves it and
/// gives the shortfall.
fn take(bucket: &mut BucketState, p: &BucketParams, now: Micros, c: f64) -> Result<(), Shortfall> {
    if c <= 0.0 {
        return Ok(());
    }
    let now = now.max(bucket.ts);
    let r = bucket::refill(*bucket, p, now);
    if let Some(short) = bucket::shortfall(&r, p, now, c) {
        return Err(short);
    }
    *bucket = BucketState {
        tokens: r.tokens - c,
        ..r
    };
    Ok(())
}

/// [`take`] on a copy: the bucket with `c` taken, or the wait.
fn take_one(s: BucketState, p: &BucketParams, now: Micros, c: f64) -> Result<BucketState, Micros> {
    let mut taken = s;
    take(&mut taken, p, now, c)
        .map(|()| taken)
        .map_err(Shortfall::micros)
}

/// [`try_acquire`] as the composition of [`wait_all`] and `take_all`: any
/// number of limits, and the reference the one-limit path is checked
/// against.
fn try_acquire_in_two_passes(
    state: &mut ResourceState,
    spec: &LimitSpec,
    now: Micros,
    cost: Cost,
    lease: LeaseId,
) -> Decision {
    let wait = wait_all(state, spec, now, cost);
    if wait > 0 {
        return Decision::deny(DenyReason::Rate, wait);
    }
    if !hold_slot(state, spec, now, lease) {
        return Decision::deny(DenyReason::Concurrency, 0);
    }
    book_all(state, spec, now, cost, 0);
    Decision::allow(spec.max_concurrent.map(|_| lease))
}

/// `reserve` over all rate limits: books `cost` in every bucket for the
/// latest of their earliest times, or books nothing if that is beyond
/// `max_wait`. Concurrency slots are not reserved (see [`hold_slot`]).
/// A resource without rate limits books for the end of its
/// [`ResourceState::hold`] (the wait is the time left of it; nothing to
/// take, so nothing changes).
pub fn reserve(
    state: &mut ResourceState,
    spec: &LimitSpec,
    now: Micros,
    cost: Cost,
    max_wait: Micros,
) -> Reservation {
    let wait = wait_all(state, spec, now, cost);
    let marks =
        costs(spec, cost)
            .zip(&state.buckets)
            .map(|(c, s)| if c > 0.0 { s.nb.max(now) } else { now });
    let since = Marks::new(now, marks).due_at(now.saturating_add(wait));
    if wait > max_wait {
        return Reservation {
            wait,
            booked: false,
            since,
        };
    }
    book_all(state, spec, now, cost, wait);
    Reservation {
        wait,
        booked: true,
        since,
    }
}

/// Takes a concurrency slot under `lease` if one is free. True when held
/// (always true without a concurrency limit).
pub fn hold_slot(state: &mut ResourceState, spec: &LimitSpec, now: Micros, lease: LeaseId) -> bool {
    let Some(max) = spec.max_concurrent else {
        return true;
    };
    purge_expired(&mut state.leases, now);
    if state.leases.len() >= max as usize {
        return false;
    }
    state.leases.push(Lease {
        id: lease,
        expires: now.saturating_add(spec.lease_ttl),
    });
    true
}

/// `release`: frees the slot held under `lease`. Idempotent: releasing an
/// unknown or already released lease changes nothing and returns false.
/// Lease ids are unique, so the scan stops at the lease, and the last
/// lease takes its place (the order of leases means nothing).
pub fn release(state: &mut ResourceState, lease: LeaseId) -> bool {
    match state.leases.iter().position(|l| l.id == lease) {
        Some(i) => {
            state.leases.swap_remove(i);
            true
        }
        None => false,
    }
}

/// `renew`: extends `lease`, while it is live (held, and not expired at
/// `now`), to the spec's `lease_ttl` from `now`; true when it was live. An
/// expired lease is not brought back, even before a purge removes it: its
/// slot may be another holder's.
pub fn renew(state: &mut ResourceState, spec: &LimitSpec, now: Micros, lease: LeaseId) -> bool {
    match state.leases.iter_mut().find(|l| l.id == lease) {
        Some(l) if l.expires > now => {
            l.expires = now.saturating_add(spec.lease_ttl);
            true
        }
        _ => false,
    }
}

/// `settle`: corrects the charge of every bucket from `reserved` to
/// `actual`. `since`: the settled reservation's [`Reservation::since`], if
/// there was one: its marks and its due time (see [`bucket::settle`]).
pub fn settle(
    state: &mut ResourceState,
    spec: &LimitSpec,
    now: Micros,
    reserved: Cost,
    actual: Cost,
    since: Option<Marks>,
) {
    for (i, (u, p)) in spec.buckets.iter().enumerate() {
        let delta = reserved.of(*u) as f64 - actual.of(*u) as f64;
        if delta != 0.0 {
            let (mark, due) = (since.map(|m| m.of(i)), since.map(|m| m.due()));
            state.buckets[i] = bucket::settle(state.buckets[i], p, now, delta, mark, due);
        }
    }
}

/// `penalize`: drains every bucket and holds it until `until`. A resource
/// without rate limits has no bucket to hold: its
/// [`ResourceState::hold`] is set to `until` instead (never shortened), so
/// that every user of the store waits it out.
pub fn penalize(state: &mut ResourceState, spec: &LimitSpec, now: Micros, until: Micros) {
    if spec.buckets.is_empty() {
        state.hold = state.hold.max(until);
        return;
    }
    for (i, (_, p)) in spec.buckets.iter().enumerate() {
        state.buckets[i] = bucket::penalize(state.buckets[i], p, now, until);
    }
}

/// The end of the penalty `state` is under, whatever limits it was made
/// for: the latest not-before of its buckets (a 429's hold, or a spent
/// counter's until its reset), or its [`ResourceState::hold`]; 0 for
/// none. On the state's own clock (see [`bucket::on_bucket_time`]).
pub fn held_until(state: &ResourceState) -> Micros {
    latest_not_before(&state.buckets).max(state.hold)
}

/// The latest not-before of `buckets` (made for any limits); 0 for none.
pub fn latest_not_before(buckets: &[BucketState]) -> Micros {
    buckets.iter().map(|b| b.nb).max().unwrap_or(0)
}

/// `hold_until`: holds `state` (made for `spec`) until `until`, as
/// [`penalize`] does but without draining a bucket: each bucket's
/// not-before moves to `until` (on the bucket's time, see
/// [`bucket::on_bucket_time`]) unless it is later; with no bucket, the
/// [`ResourceState::hold`] does. Never shortens a hold.
pub fn hold_until(state: &mut ResourceState, spec: &LimitSpec, now: Micros, until: Micros) {
    if spec.buckets.is_empty() {
        state.hold = state.hold.max(until);
        return;
    }
    for b in &mut state.buckets {
        b.nb = b.nb.max(bucket::on_bucket_time(b, now, until));
    }
}

/// `adopt`: the state of a key made for other limits with another number
/// of rate limits (a reload), taken on under `spec` as of `now`. Its
/// buckets cannot be matched to the new ones, so they start full, as
/// [`ResourceState::fresh`]; its leases stay held, so the concurrency
/// limit still counts them; and the penalty it was under (see
/// [`held_until`]) holds the new state until the same end (see
/// [`hold_until`]): a reload while an upstream's 429 holds the resource
/// does not let calls through before the upstream said they may come.
///
/// The buckets are held, not drained: what `adopt` makes does not depend
/// on when after the reload it runs (a full bucket stays full), so a
/// store that does not write the adopted state back on every call (the
/// Redis scripts write nothing on a denial, and `hold_slot` reads no
/// bucket) decides as one that does.
///
/// ```
/// use broker_core::state::{self, LimitSpec, ResourceState};
/// use broker_core::{Limits, RateLimit};
/// use std::time::Duration;
///
/// let ttl = Duration::from_secs(60);
/// let one = LimitSpec::new(&Limits::new().rate(RateLimit::per_second(10)), ttl);
/// let mut s = ResourceState::fresh(&one, 0);
/// state::penalize(&mut s, &one, 0, 3_000_000);
/// let two = LimitSpec::new(
///     &Limits::new().rate(RateLimit::per_second(10)).rate(RateLimit::per_minute(100)),
///     ttl,
/// );
/// let s = state::adopt(s, &two, 1_000_000);
/// assert_eq!(state::wait_all(&s, &two, 1_000_000, broker_core::Cost::default()), 2_000_000);
/// ```
pub fn adopt(old: ResourceState, spec: &LimitSpec, now: Micros) -> ResourceState {
    let until = held_until(&old);
    let mut state = ResourceState {
        leases: old.leases,
        ..ResourceState::fresh(spec, now)
    };
    if until > now {
        hold_until(&mut state, spec, now, until);
    }
    state
}

/// The upstream counter that describes bucket `i` of `spec`, if any. An
/// upstream reports one window per unit; with several buckets of a unit
/// (10 a second and 1,000 a day), it describes one of them: the bucket
/// whose burst is nearest the reported limit, or without a limit the
/// shortest window (ties: the shorter window), of the buckets whose window
/// can last until the counter's reset (see [`can_last_until`]; when none
/// can, of those slowest to fill), and of the buckets whose burst is the
/// reported limit if there are any, whatever the reset; first of all, of
/// the buckets whose period is the counter's window (IETF `w`, or that
/// window paced) if there are any. The others are left alone, so a per-second counter at 0 does
/// not drain the daily budget, a per-minute one reporting a reset of
/// minutes neither, and a daily counter, whose reset is hours away, is not
/// read as the per-second bucket's.
pub fn observed_for<'o>(
    spec: &LimitSpec,
    observed: &'o ObservedLimit,
    i: usize,
) -> Option<&'o super::observed::Observed> {
    let (unit, _) = spec.buckets.get(i)?;
    let o = observed.of(*unit)?;
    let distance = |p: &BucketParams| match o.limit {
        Some(limit) => (p.capacity() - limit as f64).abs(),
        None => 0.0,
    };
    // A window that is a bucket's period (as a pacing margin stretches
    // it, at most `1 / (1 - MAX_MARGIN)` times) names the bucket first.
    let spans = |p: &BucketParams| {
        o.window.is_some_and(|w| {
            let w = micros(w) as f64;
            (w..=w / (1.0 - super::pacing::MAX_MARGIN) + 1.0).contains(&p.period())
        })
    };
    let spanned = spec.buckets.iter().any(|(u, p)| u == unit && spans(p));
    let of_unit = || {
        spec.buckets
            .iter()
            .enumerate()
            .filter(move |(_, (u, p))| u == unit && (!spanned || spans(p)))
    };
    // A limit that is a bucket's burst names the bucket: a counter's reset
    // may outlast its window (OpenAI's per-minute counters report resets
    // such as "6m0s"), and a per-minute counter read as the day's would
    // drain the daily budget.
    let names = |p: &BucketParams| o.limit.is_some_and(|l| p.capacity() == l as f64);
    let named = of_unit().any(|(_, (_, p))| names(p));
    let candidates = || of_unit().filter(move |(_, (_, p))| !named || names(p));
    let lasts = |p: &BucketParams| o.reset.is_none_or(|reset| can_last_until(p, reset));
    let longest = candidates()
        .map(|(_, (_, p))| full_after(p))
        .fold(0.0, f64::max);
    // Of the buckets that can last until the reset; when none can, the
    // ones that come nearest (the longest to fill).
    let some_lasts = candidates().any(|(_, (_, p))| lasts(p));
    let described = candidates()
        .filter(|(_, (_, p))| match some_lasts {
            true => lasts(p),
            false => full_after(p) >= longest,
        })
        .min_by(|(_, (_, a)), (_, (_, b))| {
            distance(a)
                .total_cmp(&distance(b))
                .then(a.period().total_cmp(&b.period()))
        })
        .map(|(j, _)| j);
    (described == Some(i)).then_some(o)
}

/// Whether a counter that resets `reset` from now can count the window of
/// a bucket of `params`: the bucket refills from empty to full no faster
/// than half as fast as that, with a second to spare for a reset rounded
/// up to whole seconds. A bucket full again in one second cannot be the
/// window of a counter that resets in five hours.
pub fn can_last_until(params: &BucketParams, reset: std::time::Duration) -> bool {
    micros(reset) as f64 <= 2.0 * full_after(params) + 1e6
}

/// How long a bucket of `params` takes to refill from empty to full, in µs.
fn full_after(params: &BucketParams) -> f64 {
    params.capacity() * params.micros_per_token()
}

/// `reconcile`: narrows each bucket to the upstream counter that describes
/// it (see [`observed_for`]).
pub fn reconcile(
    state: &mut ResourceState,
    spec: &LimitSpec,
    now: Micros,
    observed: &ObservedLimit,
) {
    for (i, (_, p)) in spec.buckets.iter().enumerate() {
        let Some(o) = observed_for(spec, observed, i) else {
            continue;
        };
        let Some(remaining) = o.remaining else {
            continue;
        };
        if remaining as f64 >= p.capacity() {
            continue;
        }
        let reset_at = o.reset.map(|r| now.saturating_add(micros(r)));
        state.buckets[i] = bucket::reconcile(state.buckets[i], p, now, remaining as f64, reset_at);
    }
}

/// True when every bucket is idle, no lease is live and no
/// [`ResourceState::hold`] is in force: the state equals a fresh one and
/// may be dropped.
pub fn is_idle(state: &ResourceState, spec: &LimitSpec, now: Micros) -> bool {
    state.hold <= now
        && state.leases.iter().all(|l| l.expires <= now)
        && spec
            .buckets
            .iter()
            .zip(&state.buckets)
            .all(|((_, p), s)| bucket::is_idle(s, p, now))
}

/// How long the state must be kept (the longest bucket TTL, lease, or
/// [`ResourceState::hold`]).
pub fn ttl(state: &ResourceState, spec: &LimitSpec, now: Micros) -> Micros {
    let buckets = spec
        .buckets
        .iter()
        .zip(&state.buckets)
        .map(|((_, p), s)| bucket::ttl(s, p, now))
        .max()
        .unwrap_or(0);
    let leases = state
        .leases
        .iter()
        .map(|l| l.expires.saturating_sub(now))
        .max()
        .unwrap_or(0);
    buckets.max(leases).max(state.hold.saturating_sub(now))
}

#[cfg(test)]
mod tests;
