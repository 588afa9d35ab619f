//! [`ResponseFuture`]: the admission of one request. `try_acquire` on the
//! stage's resource, then either the denial (429, logged once; a tenant
//! denial first gives the route/service cost back) or the inner call,
//! whose response body takes the concurrency permit along.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use broker_core::{Acquisition, BrokerError, Cost, DenyReason, Marks, Permit, Verdict};
use http::{header, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower::Service;

use crate::body::PermitBody;
use crate::fields::field;
use crate::policy::{Limited, Policy, Refund, Stage};
use crate::response;
use crate::tenant::TenantId;

/// The broker's answer for one stage, when it came asynchronously.
struct Answer {
    result: Result<Acquisition, BrokerError>,
    /// The stage answered: the one asked for, or, for [`Stage::Both`]
    /// denied, the part that denied.
    stage: Stage,
    /// Its parts the store's failure policy answered (see
    /// [`Refund::answered_here`]).
    answered_here: u8,
    tenant: Option<TenantId>,
    policy: Arc<Policy>,
}

type AcquireFuture = Pin<Box<dyn Future<Output = Answer> + Send>>;

type RefundFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

pin_project! {
    /// The response future of [`crate::PressureService`] and
    /// [`crate::TenantService`]. Its error is the inner service's error.
    pub struct ResponseFuture<S, ReqB, ResB>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
    {
        #[pin]
        pub(crate) state: State<S, ReqB, ResB>,
    }
    impl<S, ReqB, ResB> PinnedDrop for ResponseFuture<S, ReqB, ResB>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
    {
        // A route/service admission dropped before its response (the
        // client left): see `leave`; a request the tenant stage let in:
        // see `fence`. Any other state drops as it is.
        fn drop(this: Pin<&mut Self>) {
            let mut state = this.project().state;
            if let StateProj::Calling { refundable, .. } = state.as_mut().project() {
                if let Some(refund) = refundable.take() {
                    let drop_call = || state.set(State::Answered { refusal: None });
                    match refund.stage {
                        Stage::Tenant => fence(drop_call),
                        _ => leave(refund, drop_call),
                    }
                }
            }
        }
    }
}

pin_project! {
    #[project = StateProj]
    pub(crate) enum State<S, ReqB, ResB>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
    {
        Admitting {
            acquire: AcquireFuture,
            call: Option<Box<Call<S, ReqB>>>,
        },
        Refunding {
            refund: RefundFuture,
            response: Option<Box<Response<ResB>>>,
            // Whether `refund` runs as a task of its own (see `detach`).
            detached: bool,
        },
        Calling {
            #[pin]
            fut: S::Future,
            // Empty when the stage holds nothing.
            permit: Permit,
            // The request is a `CONNECT` (see `is_long_lived`).
            connect: bool,
            // Set on the route/service stage when a tenant stage follows;
            // on a tenant stage that let the request in, a fence (of
            // `Stage::Tenant`, see `Refund::fence`).
            refundable: Option<Refund>,
        },
        Answered {
            refusal: Option<Refusal>,
        },
    }
}

/// [`ResponseFuture::admitted`] written out where the caller returns the
/// future, for the services' common case: the request moves once, straight
/// into the inner call. Through the function, inlined as it is, the
/// compiler copied the request and the inner future once more per stage
/// (51 instructions more per request through the example's two stages,
/// counted in process with `benches/http_layer.rs`).
macro_rules! admitted {
    ($inner:expr, $req:expr, $permit:expr, $refundable:expr) => {{
        $crate::future::ResponseFuture {
            state: $crate::future::calling!($inner, $req, $permit, $refundable),
        }
    }};
}
pub(crate) use admitted;

/// The state of [`admitted!`].
macro_rules! calling {
    ($inner:expr, $req:expr, $permit:expr, $refundable:expr) => {{
        let permit: broker_core::Permit = $permit;
        let connect = permit.is_held() && $req.method() == http::Method::CONNECT;
        $crate::future::State::Calling {
            fut: $inner.call($req),
            permit,
            connect,
            refundable: $refundable,
        }
    }};
}
pub(crate) use calling;

/// What the inner call needs once admitted.
struct Call<S, ReqB> {
    inner: S,
    req: Request<ReqB>,
}

/// Put in the extensions of a tenant-stage refusal (a denial, or a backend
/// failure) of a request a route/service stage charged (see
/// [`RouteCharged`]), naming the policy that refused. The route/service
/// stage of the same [`crate::Pressure`] sees it on the way out and gives its own
/// cost back, so one tenant's rejected flood does not use up the limit
/// every tenant shares. Nothing is added to admitted requests or
/// responses, and an admitted request holds no reference to the policy
/// for it.
#[derive(Clone)]
struct TenantDenied {
    /// The denying policy (its `id` names its [`crate::Pressure`]).
    policy: Arc<Policy>,
}

/// Put in the extensions of a request by a route/service stage that a
/// tenant denial refunds: a tenant stage refusing a request that carries
/// it names its policy on the response ([`TenantDenied`]), and the
/// route/service stage of that policy gives its cost back. A request
/// built anew in a handler (a nested call) carries none, so the tenant
/// denial it meets is answered without one, and a route/service stage
/// around a handler that answers with it keeps its cost, whether a tenant
/// stage of the request's own stands between them or not.
///
/// Of no size, so inserting it allocates nothing of its own; it names no
/// policy, as the denial does: a route/service stage refunds only a
/// [`TenantDenied`] of its own policy.
#[derive(Clone, Copy)]
struct RouteCharged;

/// Marks `req` as charged by a route/service stage whose cost a tenant
/// denial gives back (`refund`, see [`Policy::refund_for`]).
#[inline]
pub(crate) fn mark_charged<B>(req: &mut Request<B>, refund: Option<Refund>) {
    if refund.is_some() {
        req.extensions_mut().insert(RouteCharged);
    }
}

/// Whether a route/service stage that a tenant denial refunds charged
/// `req` (see [`RouteCharged`]).
#[cold]
fn route_charged<B>(req: &Request<B>) -> bool {
    req.extensions().get::<RouteCharged>().is_some()
}

/// Gives `stage` of `policy` (each part of [`Stage::Both`]) its cost
/// back, where it was charged: the parts whose bit is set in
/// `answered_here` were answered by the store's failure policy (their
/// cost went to this process's fallback bucket, or nowhere), the others
/// by the store.
async fn refund(policy: Arc<Policy>, stage: Stage, answered_here: u8) {
    for (i, stage) in stage.parts().enumerate() {
        let Some(limited) = policy.limited(stage) else {
            continue;
        };
        // Errors are counted and logged by the broker; a failed refund
        // only leaves the cost charged, as without a refund.
        let since = (answered_here >> i & 1 == 1).then_some(Marks::ANSWERED_HERE);
        let _ = policy
            .broker
            .settle_since(&*limited.id, Cost::default(), Cost::requests(0), since)
            .await;
    }
}

/// Whether the store's failure policy answered `result` (its cost is not
/// in the store): `1` if so, else `0`. Told by the answer itself, not by
/// the store's health, which another call may change at any time.
fn answered_here(result: &Result<Acquisition, BrokerError>) -> u8 {
    result.as_ref().map_or(0, |a| u8::from(a.answered_here))
}

/// A response that keeps its connection for as long as the client stays,
/// so holds no slot: protocols switched (a WebSocket or other upgrade), a
/// tunnel that a `CONNECT` request (`connect`: an HTTP/2 extended CONNECT)
/// opened with a 2xx, or server-sent events of no set length. Decided by
/// the response, not by what the request asked for: a request with an
/// `Upgrade` field that is answered as any other holds its slot to the end
/// of the body. A body of known length ends by itself, so its response
/// holds its slot whatever its type says (and is told apart without a
/// look at the fields).
#[inline]
fn is_long_lived<B: PermitBody>(connect: bool, res: &Response<B>) -> bool {
    res.status() == StatusCode::SWITCHING_PROTOCOLS
        || (connect && res.status().is_success())
        || (!res.body().has_exact_length() && is_event_stream(res))
}

/// Whether `res` says it is a stream of server-sent events.
#[inline(never)]
fn is_event_stream<B>(res: &Response<B>) -> bool {
    field(res.headers(), &header::CONTENT_TYPE).is_some_and(|v| {
        let ct = v.as_bytes();
        // The letter after `text/` first: most types are told apart by
        // it, without comparing 17 bytes.
        ct.len() >= 17
            && ct[5].eq_ignore_ascii_case(&b'e')
            && ct[..17].eq_ignore_ascii_case(b"text/event-stream")
    })
}

impl<S, ReqB, ResB> ResponseFuture<S, ReqB, ResB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: PermitBody,
{
    /// Passes the inner call through untouched (no limit applies to it).
    #[inline]
    pub(crate) fn pass(fut: S::Future) -> Self {
        Self {
            state: State::Calling {
                fut,
                permit: Permit::empty(),
                connect: false,
                refundable: None,
            },
        }
    }

    /// Goes on with what a stage decided (see [`judge`]): calls `inner`
    /// with `req`, the response taking `permit` along, or answers at once.
    /// `refundable`: set on the route/service stage when a tenant stage
    /// follows.
    #[inline(always)]
    pub(crate) fn decided(
        verdict: Result<Permit, Refusal>,
        refundable: Option<Refund>,
        inner: &mut S,
        req: Request<ReqB>,
    ) -> Self {
        match verdict {
            Ok(permit) => Self::admitted(permit, refundable, inner, req),
            Err(refusal) => Self::refused(refusal),
        }
    }

    /// Calls `inner` with `req`, the response taking `permit` along.
    /// `refundable`: set on the route/service stage when a tenant stage
    /// follows.
    #[inline(always)]
    pub(crate) fn admitted(
        permit: Permit,
        refundable: Option<Refund>,
        inner: &mut S,
        req: Request<ReqB>,
    ) -> Self {
        admitted!(inner, req, permit, refundable)
    }

    /// Answers `refusal` when polled.
    #[inline(always)]
    pub(crate) fn refused(refusal: Refusal) -> Self {
        Self {
            state: State::Answered {
                refusal: Some(refusal),
            },
        }
    }

    /// The route/service stage without a compact answer from
    /// `verdict_now` (a store that needs I/O, a cost that never fits): the
    /// broker's answer in full, or, from a store that needs I/O, the
    /// admission once it has answered.
    #[cold]
    #[inline(never)]
    pub(crate) fn in_full(
        policy: &Arc<Policy>,
        stage: Stage,
        limited: &Limited,
        inner: &mut S,
        req: Request<ReqB>,
    ) -> Self
    where
        S: Clone,
    {
        match limited.handle.try_acquire_now(None, Cost::default()) {
            Some(result) => {
                let here = answered_here(&result);
                let verdict = judge(policy, stage, limited, result, None);
                let refundable = policy.refund_for(stage).map(|r| r.answered_here(here));
                Self::decided(verdict, refundable, inner, req)
            }
            None => Self::admit_later(policy, stage, None, inner, req),
        }
    }

    /// Admits `req` on `stage` (on each part of [`Stage::Both`]) once the
    /// broker has answered asynchronously, then calls a ready clone of
    /// `inner`.
    #[cold]
    #[inline(never)]
    pub(crate) fn admit_later(
        policy: &Arc<Policy>,
        stage: Stage,
        tenant: Option<TenantId>,
        inner: &mut S,
        req: Request<ReqB>,
    ) -> Self
    where
        S: Clone,
    {
        // Only the tenant stage deciding a request that a route/service
        // stage charged (not a nested call's) tells it, when dropped in
        // flight, that the request never reached its handler.
        let tells = stage == Stage::Tenant && route_charged(&req);
        let policy = policy.clone();
        let clone = inner.clone();
        let call = Call {
            inner: std::mem::replace(inner, clone),
            req,
        };
        let acquire: AcquireFuture = Box::pin(async move {
            let tenant_key = tenant.as_ref().map(TenantId::as_str);
            let mut unanswered = Unanswered(tells.then_some(&policy));
            let (stage, result, answered_here) = acquire(&policy, stage, tenant_key).await;
            unanswered.0 = None;
            drop(unanswered);
            Answer {
                result,
                stage,
                answered_here,
                tenant,
                policy,
            }
        });
        Self {
            state: State::Admitting {
                acquire,
                call: Some(Box::new(call)),
            },
        }
    }
}

/// The broker's answer on `stage` of `policy` for the tenant key
/// `tenant`, if given, with the stage it is of and the parts of it the
/// store's failure policy answered (see [`Refund::answered_here`]).
/// [`Stage::Both`] is asked part by part: the first part's denial; else
/// the second part's, with the first part's cost given back and its
/// permit released; else the admission, holding both parts' permits.
async fn acquire(
    policy: &Arc<Policy>,
    stage: Stage,
    tenant: Option<&str>,
) -> (Stage, Result<Acquisition, BrokerError>, u8) {
    let mut parts = stage.parts();
    let (Some(first), Some(second)) = (parts.next(), parts.next()) else {
        let result = acquire_on(policy, stage, tenant).await;
        let here = answered_here(&result);
        return (stage, result, here);
    };
    let admitted = match acquire_on(policy, first, tenant).await {
        Ok(a) if a.allowed => a,
        refused => {
            let here = answered_here(&refused);
            return (first, refused, here);
        }
    };
    let first_here = u8::from(admitted.answered_here);
    // Until the second part has answered: a client that leaves meanwhile
    // (the response future dropped) gets the first part's cost given back,
    // as an admission dropped in flight is not charged.
    let mut unanswered = FirstPart {
        refund: Some((policy.clone(), first, first_here)),
    };
    let result = acquire_on(policy, second, tenant).await;
    let second_here = answered_here(&result);
    let refund = unanswered.refund.take();
    match result {
        Ok(mut both) if both.allowed => {
            both.permit = admitted.permit.join(both.permit);
            (stage, Ok(both), first_here | second_here << 1)
        }
        refused => {
            drop(admitted);
            if let Some((policy, first, here)) = refund {
                to_the_end(Box::pin(self::refund(policy, first, here))).await;
            }
            (second, refused, second_here)
        }
    }
}

/// The first part of a [`Stage::Both`] admission, admitted, while the
/// second is asked: dropped before that answer, it gives the first part's
/// cost back from a task of its own (its permit goes with the dropped
/// acquisition).
struct FirstPart {
    refund: Option<(Arc<Policy>, Stage, u8)>,
}

impl Drop for FirstPart {
    fn drop(&mut self) {
        let Some((policy, first, here)) = self.refund.take() else {
            return;
        };
        // Without a runtime (it is shutting down), the cost stays charged.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(refund(policy, first, here));
        }
    }
}

thread_local! {
    /// While a route/service stage drops the inner call it admitted (see
    /// [`leave`]): the id of its policy.
    static LEAVING: Cell<Option<u64>> = const { Cell::new(None) };
    /// The policy of that id, once a tenant stage of it was dropped
    /// meanwhile with its decision in flight (see [`Unanswered`]).
    static LEFT_UNANSWERED: Cell<Option<Arc<Policy>>> = const { Cell::new(None) };
}

/// Takes what [`LEFT_UNANSWERED`] holds; nothing once the thread's locals
/// are being torn down (a future dropped then is dropped as it is).
fn take_left() -> Option<Arc<Policy>> {
    LEFT_UNANSWERED.try_with(Cell::take).ok().flatten()
}

/// Puts `left` in [`LEFT_UNANSWERED`]; dropped instead once the thread's
/// locals are being torn down.
fn put_left(left: Option<Arc<Policy>>) {
    let _ = LEFT_UNANSWERED.try_with(|l| l.set(left));
}

/// The tenant stage's decision while it is in flight (the policy, until
/// it is answered): dropped before its answer, it tells the route/service
/// stage of the same policy whose inner call is being dropped (see
/// [`leave`]). A store that answers in process never leaves one in flight.
struct Unanswered<'p>(Option<&'p Arc<Policy>>);

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        let Some(policy) = self.0 else {
            return;
        };
        if LEAVING.get() == Some(policy.id) {
            put_left(Some(policy.clone()));
        }
    }
}

/// What [`leave`] sets aside while it drops an inner call, put back once
/// it is dropped (a panic on the way included).
struct Leaving {
    outer: Option<u64>,
    outer_left: Option<Arc<Policy>>,
}

impl Drop for Leaving {
    fn drop(&mut self) {
        LEAVING.set(self.outer);
        put_left(self.outer_left.take());
    }
}

/// Drops (with `drop_call`) the inner call of a tenant stage that let its
/// request in: the request's handler, so a tenant stage in flight in there
/// is another request's (a nested call through the same policy), not this
/// one's. A route/service stage leaving around it (see [`leave`]) is not
/// told of it: the request reached its handler.
#[cold]
#[inline(never)]
fn fence(drop_call: impl FnOnce()) {
    let _scope = Leaving {
        outer: LEAVING.replace(None),
        outer_left: take_left(),
    };
    drop_call();
}

/// Drops (with `drop_call`) the inner call of a route/service admission
/// that `refund` describes, before its response: the client left. If a
/// tenant stage of the same policy inside it is dropped meanwhile with its
/// decision in flight, the request never reached its handler, so the
/// route/service stage gets its cost back, from a task of its own, as a
/// tenant denial gives it back (and as the first reading of a path read
/// two ways does when the client leaves before the second answers); the
/// tenant stage's own decision gives its cost back in the broker. Its
/// slot goes with its permit, dropped here. Without a runtime (it is
/// shutting down), the cost stays charged.
#[cold]
#[inline(never)]
fn leave(refund: Refund, drop_call: impl FnOnce()) {
    let scope = Leaving {
        outer: LEAVING.replace(Some(refund.policy)),
        outer_left: take_left(),
    };
    drop_call();
    let left = take_left();
    drop(scope);
    let Some(policy) = left else {
        return;
    };
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(self::refund(policy, refund.stage, refund.answered_here));
    }
}

/// The broker's answer on the one resource of `stage`.
async fn acquire_on(
    policy: &Policy,
    stage: Stage,
    tenant: Option<&str>,
) -> Result<Acquisition, BrokerError> {
    match policy.limited(stage) {
        Some(limited) => limited.handle.try_acquire(tenant, Cost::default()).await,
        None => Ok(unlimited()),
    }
}

/// An allowed acquisition holding nothing (a stage without a resource).
fn unlimited() -> Acquisition {
    Acquisition {
        allowed: true,
        wait_time: Duration::ZERO,
        denied_by: None,
        permit: Permit::empty(),
        answered_here: false,
    }
}

/// What `stage` (resource `limited` of `policy`) makes of the broker's
/// answer `result` for the tenant key `tenant`, if given: the permit the
/// admitted request carries (empty without a concurrency limit), or the
/// refusal (a denial or a backend failure) to answer.
#[inline]
pub(crate) fn judge(
    policy: &Arc<Policy>,
    stage: Stage,
    limited: &Limited,
    result: Result<Acquisition, BrokerError>,
    tenant: Option<&str>,
) -> Result<Permit, Refusal> {
    match result {
        Ok(acquisition) if acquisition.allowed => Ok(acquisition.permit),
        refused => Err(refusal(policy, stage, limited, refused, tenant)),
    }
}

/// A denied or failed admission, logged when decided and answered when
/// the future is polled: small, so the future that may hold it stays the
/// size of an admitted request's (no allocation for it either).
pub(crate) struct Refusal {
    policy: Arc<Policy>,
    stage: Stage,
    /// The wait of a denial; none for a backend failure.
    wait: Option<Duration>,
    /// Denied by the concurrency limit, not by a rate.
    by_concurrency: bool,
    /// A tenant-stage refusal of a request that a route/service stage of
    /// the same policy charged (see [`RouteCharged`]): that stage gives
    /// its cost back.
    refunds: bool,
}

impl Refusal {
    /// This refusal, by the tenant stage, of `req`: it refunds the
    /// route/service stage of its policy that charged `req`, if one did.
    #[cold]
    pub(crate) fn of<B>(mut self, req: &Request<B>) -> Self {
        self.refunds = self.stage == Stage::Tenant && route_charged(req);
        self
    }

    /// The response: the denial or the backend failure (a tenant-stage
    /// refusal of either kind names its policy, so the route/service stage
    /// gives its cost back).
    #[cold]
    #[inline(never)]
    fn respond<ResB: PermitBody>(self) -> Response<ResB> {
        let Refusal {
            policy,
            stage,
            wait,
            by_concurrency,
            refunds,
        } = self;
        let mut response = match (wait, policy.limited(stage)) {
            (Some(wait), Some(limited)) => response::denied(
                &policy.responses,
                &limited.headers(&policy.broker),
                wait,
                by_concurrency,
            ),
            _ => response::backend_failed(&policy.responses),
        };
        // A tenant-stage refusal, a denial or a backend failure, lets the
        // request go no further: the route/service stage gives its cost
        // back, as a second reading's failure gives the first's back.
        if refunds {
            response.extensions_mut().insert(TenantDenied { policy });
        }
        response
    }
}

/// The refusal of a denial given as a compact [`Verdict`] (not allowed),
/// logged once, as an event.
#[cold]
#[inline(never)]
pub(crate) fn denial(
    policy: &Arc<Policy>,
    stage: Stage,
    limited: &Limited,
    verdict: Verdict,
    tenant: Option<&str>,
) -> Refusal {
    let (wait, reason) = match verdict {
        Verdict::Rate(wait) => (Duration::from_micros(wait), DenyReason::Rate),
        _ => (Duration::ZERO, DenyReason::Concurrency),
    };
    logged_denial(policy, stage, limited, wait, Some(reason), tenant)
}

/// The refusal of a denial that waits `wait`, denied by `denied_by`,
/// logged once, as an event.
fn logged_denial(
    policy: &Arc<Policy>,
    stage: Stage,
    limited: &Limited,
    wait: Duration,
    denied_by: Option<DenyReason>,
    tenant: Option<&str>,
) -> Refusal {
    tracing::info!(
        resource = %limited.id,
        layer = stage.name(),
        wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        tenant,
        denied_by = ?denied_by,
        "request denied"
    );
    Refusal {
        policy: policy.clone(),
        stage,
        wait: Some(wait),
        by_concurrency: denied_by == Some(DenyReason::Concurrency),
        refunds: false,
    }
}

/// The refusal of a denied or failed admission, logged (a denial once, as
/// an event; a backend failure at debug level, the broker warns).
#[cold]
#[inline(never)]
fn refusal(
    policy: &Arc<Policy>,
    stage: Stage,
    limited: &Limited,
    result: Result<Acquisition, BrokerError>,
    tenant: Option<&str>,
) -> Refusal {
    match result {
        Ok(a) => logged_denial(policy, stage, limited, a.wait_time, a.denied_by, tenant),
        Err(error) => {
            // The broker counts backend errors and warns about them (at
            // most once per 10 s per resource); per request, this is detail.
            tracing::debug!(
                resource = %limited.id,
                layer = stage.name(),
                tenant,
                %error,
                "pressure check failed; answering the backend-error status"
            );
            Refusal {
                policy: policy.clone(),
                stage,
                wait: None,
                by_concurrency: false,
                refunds: false,
            }
        }
    }
}

impl<S, ReqB, ResB> Future for ResponseFuture<S, ReqB, ResB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: PermitBody,
{
    type Output = Result<Response<ResB>, S::Error>;

    /// The inner call's poll, in line (the common state): its output is
    /// returned where it was written, with the permit put in the body and
    /// the refund looked for in place; every other state is polled out of
    /// line.
    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            let StateProj::Calling {
                fut,
                permit,
                connect,
                refundable,
            } = state.as_mut().project()
            else {
                match Self::poll_other(state.as_mut(), cx) {
                    Some(out) => return out,
                    None => continue,
                }
            };
            if !permit.is_held() && refundable.is_none() {
                // Nothing to add to the response: pass it as is.
                return fut.poll(cx);
            }
            let mut out = fut.poll(cx);
            let Poll::Ready(Ok(res)) = &mut out else {
                return out;
            };
            // Released here, at once, unless the body takes it along.
            if permit.is_held() {
                let permit = std::mem::take(permit);
                if !is_long_lived(*connect, res) {
                    res.body_mut().hold(permit);
                }
            }
            if let Some(refund_of) = refundable.take() {
                if refund_of.stage == Stage::Tenant {
                    // A fence (see `Refund::fence`): nothing to refund.
                    if res.extensions().get::<TenantDenied>().is_some() {
                        not_this_requests(res, refund_of.policy);
                    }
                } else if let Some(refund) = refund_for(res, refund_of) {
                    // Refunded here, the denial is this request's no more:
                    // a route/service stage around a handler that answers
                    // with this response (a nested call's) keeps its cost.
                    res.extensions_mut().remove::<TenantDenied>();
                    let Poll::Ready(Ok(res)) = out else {
                        unreachable!("matched above")
                    };
                    state.set(State::Refunding {
                        refund,
                        response: Some(Box::new(res)),
                        detached: false,
                    });
                    continue;
                }
            }
            return out;
        }
    }
}

/// Moves a refund that is waiting for its store (one that needs I/O) to a
/// task of its own, and makes `refund` the wait for that task: a client
/// that leaves meanwhile (which drops the response future) no longer cuts
/// the refund off, which would leave the route/service stage's cost
/// charged for a request the tenant stage refused. False outside a tokio
/// runtime (the refund then stays where it is).
#[cold]
fn detach(refund: &mut RefundFuture) -> bool {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return false;
    };
    let rest = std::mem::replace(refund, Box::pin(std::future::ready(())));
    let task = runtime.spawn(rest);
    *refund = Box::pin(async move {
        // A refund that panicked only leaves the cost charged.
        let _ = task.await;
    });
    true
}

/// Waits for `refund`, which runs to its end if the wait is dropped (a
/// client that leaves, which drops the response future): polled here
/// first, and moved to a task of its own if it waits for its store (see
/// [`detach`]). Cut off, it would leave a stage's cost charged for a
/// request that was refused.
async fn to_the_end(mut refund: RefundFuture) {
    let mut detached = false;
    std::future::poll_fn(|cx| {
        if refund.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        if detached || !detach(&mut refund) {
            return Poll::Pending;
        }
        detached = true;
        refund.as_mut().poll(cx)
    })
    .await
}

/// The refund of the route/service stage `refund_of` when `res` is a
/// denial by the tenant stage of the same policy.
#[inline]
fn refund_for<B>(res: &Response<B>, refund_of: Refund) -> Option<RefundFuture> {
    let denied = res.extensions().get::<TenantDenied>()?;
    (denied.policy.id == refund_of.policy).then(|| {
        let refund = refund(
            denied.policy.clone(),
            refund_of.stage,
            refund_of.answered_here,
        );
        Box::pin(refund) as RefundFuture
    })
}

/// Takes the tenant denial of the policy `policy` off `res`, a response of
/// a handler the tenant stage of that policy let its request into (see
/// [`Refund::fence`]): the denial is a nested call's (a part of the
/// handler's work, refused), answered as the handler's own response. The
/// route/service stage around that tenant stage then keeps its cost, as
/// for any request that reached its handler.
#[cold]
#[inline(never)]
fn not_this_requests<B>(res: &mut Response<B>, policy: u64) {
    let extensions = res.extensions_mut();
    if extensions
        .get::<TenantDenied>()
        .is_some_and(|d| d.policy.id == policy)
    {
        extensions.remove::<TenantDenied>();
    }
}

impl<S, ReqB, ResB> ResponseFuture<S, ReqB, ResB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: PermitBody,
{
    /// Polls a state other than the inner call: its output, or `None`
    /// once it has moved on to another state (the inner call, or the
    /// answer to a refusal), to be polled next.
    #[inline(never)]
    fn poll_other(
        mut state: Pin<&mut State<S, ReqB, ResB>>,
        cx: &mut Context<'_>,
    ) -> Option<Poll<Result<Response<ResB>, S::Error>>> {
        match state.as_mut().project() {
            StateProj::Admitting { acquire, call } => {
                let Poll::Ready(answer) = acquire.as_mut().poll(cx) else {
                    return Some(Poll::Pending);
                };
                let call = call.take().expect("ResponseFuture polled after completion");
                let Call { mut inner, req } = *call;
                let Answer {
                    result,
                    stage,
                    answered_here,
                    tenant,
                    policy,
                } = answer;
                let tenant = tenant.as_ref().map(TenantId::as_str);
                let verdict = match policy.limited(stage) {
                    Some(limited) => judge(&policy, stage, limited, result, tenant),
                    // No resource (always allowed), or both parts of
                    // `Stage::Both` allowed.
                    None => Ok(result.map(|a| a.permit).unwrap_or_default()),
                };
                let refundable = match stage {
                    Stage::Tenant => Some(Refund::fence(policy.id)),
                    _ => (policy.refund_for(stage)).map(|r| r.answered_here(answered_here)),
                };
                state.set(match verdict {
                    Ok(permit) => calling!(inner, req, permit, refundable),
                    Err(refusal) => State::Answered {
                        refusal: Some(refusal.of(&req)),
                    },
                });
                None
            }
            StateProj::Refunding {
                refund,
                response,
                detached,
            } => {
                if refund.as_mut().poll(cx).is_pending() {
                    if *detached || !detach(refund) {
                        return Some(Poll::Pending);
                    }
                    *detached = true;
                    if refund.as_mut().poll(cx).is_pending() {
                        return Some(Poll::Pending);
                    }
                }
                let response = response.take();
                Some(Poll::Ready(Ok(
                    *response.expect("ResponseFuture polled after completion")
                )))
            }
            StateProj::Calling { .. } => None,
            StateProj::Answered { refusal } => {
                let refusal = refusal.take();
                Some(Poll::Ready(Ok(refusal
                    .expect("ResponseFuture polled after completion")
                    .respond())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields::tests::map;

    #[test]
    fn long_lived_responses_are_recognised_among_many_fields() {
        // A body of no set length: the fields decide.
        let mut res = Response::new(axum::body::Body::new(Endless));
        *res.headers_mut() = map(20, Some((header::CONTENT_TYPE, "Text/Event-Stream; x=1")));
        assert!(is_long_lived(false, &res));
        *res.headers_mut() = map(1, Some((header::CONTENT_TYPE, "text/plain")));
        assert!(!is_long_lived(false, &res));
        for (ct, long_lived) in [
            ("text/plain; charset=utf-8", false),
            ("text/eventx-stream", false),
            ("TEXT/EVENT-STREAM;charset=utf-8", true),
        ] {
            *res.headers_mut() = map(1, Some((header::CONTENT_TYPE, ct)));
            assert_eq!(is_long_lived(false, &res), long_lived, "{ct}");
        }
        *res.headers_mut() = map(1, Some((header::CONTENT_TYPE, "text/plain")));
        *res.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        assert!(is_long_lived(false, &res));
        // A tunnel opened by CONNECT; the same status for any other request
        // holds its slot, and a refused CONNECT too.
        *res.status_mut() = StatusCode::OK;
        assert!(is_long_lived(true, &res));
        assert!(!is_long_lived(false, &res));
        *res.status_mut() = StatusCode::FORBIDDEN;
        assert!(!is_long_lived(true, &res));
    }

    /// A body of no set length.
    struct Endless;

    impl http_body::Body for Endless {
        type Data = bytes::Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
            Poll::Pending
        }
    }

    /// An event stream of known length ends by itself: it holds its slot,
    /// in every body type the layer answers with.
    #[test]
    fn an_event_stream_of_known_length_is_not_long_lived() {
        use crate::PressureBody;
        use http_body_util::{BodyExt, Full};
        fn events<B: PermitBody>(body: B) -> Response<B> {
            let mut res = Response::new(body);
            res.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/event-stream"),
            );
            res
        }
        let text = || bytes::Bytes::from_static(b"data: x\n\n");
        assert!(is_long_lived(
            false,
            &events(axum::body::Body::new(Endless))
        ));
        assert!(!is_long_lived(
            false,
            &events(axum::body::Body::from(text()))
        ));
        assert!(is_long_lived(
            false,
            &events(PressureBody::new(Endless, None))
        ));
        let sized = PressureBody::new(Full::new(text()), None);
        assert!(!is_long_lived(false, &events(sized)));
        let fixed: PressureBody<Endless> = PressureBody::fixed(text());
        assert!(!is_long_lived(false, &events(fixed)));
        let boxed = || Full::new(text()).map_err(|never| match never {});
        assert!(!is_long_lived(false, &events(boxed().boxed())));
        assert!(!is_long_lived(false, &events(boxed().boxed_unsync())));
        let endless = || Endless.map_err(|never| match never {});
        assert!(is_long_lived(false, &events(endless().boxed())));
        assert!(is_long_lived(false, &events(endless().boxed_unsync())));
    }
}
