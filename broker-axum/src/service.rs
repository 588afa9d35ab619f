//! [`PressureService`] (route/service stage, before authentication) and
//! [`TenantService`] (tenant stage, after authentication).

use std::sync::Arc;
use std::task::{Context, Poll};

use broker_core::{Cost, Permit};
use http::{Request, Response};
use tower::Service;

use crate::body::PermitBody;
use crate::future::{admitted, denial, judge, mark_charged, Refusal, ResponseFuture};
use crate::policy::{Limited, Policy, Refund, Stage};
use crate::tenant::{TenantExtractor, TenantId};

/// The route/service stage: maps a request to its per-route resource
/// (longest matching path prefix) or else the per-service one, and answers
/// a denial at once. Built by [`crate::Pressure::layer`].
#[derive(Debug, Clone)]
pub struct PressureService<S> {
    inner: S,
    policy: Arc<Policy>,
}

impl<S> PressureService<S> {
    pub(crate) fn new(inner: S, policy: Arc<Policy>) -> Self {
        Self { inner, policy }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for PressureService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    ResB: PermitBody,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    // Out of line: the caller's future is written in place. Inlined
    // (into axum's `MapIntoResponse`), the inner call's future was built
    // aside and copied, then copied again into the caller's future: one
    // more copy of a few hundred bytes per request (`benches/http_layer.rs`,
    // `HTTP_LAYER_RUN`: 70 and 22 instructions per request fewer for the
    // tenant and route stages out of line).
    #[inline(never)]
    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        let policy = &self.policy;
        let Some((stage, limited)) = policy.stage_for(req.uri().path()) else {
            return ResponseFuture::pass(self.inner.call(req));
        };
        if let Stage::Both(..) = stage {
            // Two stages for one path (see `Policy::stage_for`).
            mark_charged(&mut req, policy.refund_for(stage));
            return ResponseFuture::admit_later(policy, stage, None, &mut self.inner, req);
        }
        // The in-memory store answers at once: no boxed future, no extra
        // poll, no clone of the inner service.
        let mut permit = Permit::empty();
        let verdict = limited
            .handle
            .verdict_now(None, Cost::default(), &mut permit);
        match verdict {
            Some(v) if v.allowed() => {
                // The request carries the mark of a refundable charge (see
                // `RouteCharged`) when a tenant stage follows.
                let refund = policy.refund_for(stage);
                mark_charged(&mut req, refund);
                admitted!(self.inner, req, permit, refund)
            }
            Some(v) => ResponseFuture::refused(denial(policy, stage, limited, v, None)),
            None => {
                mark_charged(&mut req, policy.refund_for(stage));
                ResponseFuture::in_full(policy, stage, limited, &mut self.inner, req)
            }
        }
    }
}

/// The tenant stage: keys the per-tenant resource by the tenant its
/// [`TenantExtractor`] finds (under [`crate::Pressure::tenant_key`]), so each tenant has its
/// own state, created on first sight and evicted by the backend when idle.
/// Requests without a tenant pass. Built by [`crate::Pressure::tenant_layer`].
#[derive(Clone)]
pub struct TenantService<S, E> {
    inner: S,
    policy: Arc<Policy>,
    extractor: E,
    /// Never read: keeps the service 8 bytes larger (32 bytes behind
    /// axum's `Route`, not 24). axum's `from_fn`, the usual authentication
    /// in front of this stage, boxes a copy of the service after it on
    /// every request; a 24-byte box is a chunk of glibc's smallest size
    /// class, which the small blocks of hyper and axum already fill past
    /// its per-thread cache (seven chunks) on every request, and that one
    /// more chunk there cost about 500 instructions per request in
    /// `_int_malloc` and `malloc_consolidate` in the example server
    /// (BENCHMARKS.md, "Allocator size class").
    _size: u64,
}

impl<S: std::fmt::Debug, E: std::fmt::Debug> std::fmt::Debug for TenantService<S, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantService")
            .field("inner", &self.inner)
            .field("policy", &self.policy)
            .field("extractor", &self.extractor)
            .finish()
    }
}

impl<S, E> TenantService<S, E> {
    pub(crate) fn new(inner: S, policy: Arc<Policy>, extractor: E) -> Self {
        Self {
            inner,
            policy,
            extractor,
            _size: 0,
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, E, ReqB, ResB> Service<Request<ReqB>> for TenantService<S, E>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    ResB: PermitBody,
    E: TenantExtractor,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    // Out of line, as the route stage's `call` (see there).
    #[inline(never)]
    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let policy = &self.policy;
        let Some(limited) = policy.tenant_stage() else {
            return ResponseFuture::pass(self.inner.call(req));
        };
        // The broker's answer (when it comes without I/O) is judged
        // before the request moves on.
        let mut permit = Permit::empty();
        let judged = self
            .extractor
            .tenant(req.headers(), req.extensions())
            .map(|tenant| {
                let id = policy.tenant_keys.key(&tenant);
                let key = id.as_str();
                match limited
                    .handle
                    .verdict_now(Some(key), Cost::default(), &mut permit)
                {
                    Some(v) if v.allowed() => Ok(()),
                    Some(v) => Err(NotAdmitted::Refused(denial(
                        policy,
                        Stage::Tenant,
                        limited,
                        v,
                        Some(key),
                    ))),
                    None => Err(in_full(policy, limited, &id)),
                }
            });
        // A request let in keeps a fence (see `Refund::fence`): a tenant
        // denial its handler answers with is a nested call's, not this
        // request's, and refunds no route/service stage around it.
        let fence = Some(Refund::fence(policy.id));
        // Three cases here, the others out of line: a `match` of every
        // case compiled to a jump table in static data, a cache line more
        // read per request (a server's request finds it evicted by the one
        // before).
        match judged {
            Some(Ok(())) => admitted!(self.inner, req, permit, fence),
            None => admitted!(self.inner, req, Permit::empty(), fence),
            Some(Err(not)) => not_admitted(policy, not, &mut self.inner, req),
        }
    }
}

/// The tenant stage's answer to a request it did not admit at once: the
/// denial, the broker's answer in full, or the admission once the store
/// has answered.
#[inline(never)]
fn not_admitted<S, ReqB, ResB>(
    policy: &Arc<Policy>,
    not: NotAdmitted,
    inner: &mut S,
    req: Request<ReqB>,
) -> ResponseFuture<S, ReqB, ResB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    ResB: PermitBody,
{
    match not {
        NotAdmitted::Refused(refusal) => ResponseFuture::refused(refusal.of(&req)),
        NotAdmitted::Decided(verdict) => {
            let fence = Some(Refund::fence(policy.id));
            let verdict = verdict.map_err(|refusal| refusal.of(&req));
            ResponseFuture::decided(verdict, fence, inner, req)
        }
        NotAdmitted::Later(tenant) => {
            ResponseFuture::admit_later(policy, Stage::Tenant, Some(tenant), inner, req)
        }
    }
}

/// What the tenant stage made of a request with a tenant that the compact
/// answer did not admit, before the request moves on (the tenant's key
/// borrows from it). An admission by the compact answer is `Ok(())` beside
/// it, its permit the caller's.
enum NotAdmitted {
    /// Denied, with the compact answer.
    Refused(Refusal),
    /// The broker's answer in full (no compact one).
    Decided(Result<Permit, Refusal>),
    /// The store needs I/O: admitted once it has answered.
    Later(TenantId),
}

/// The tenant stage without a compact answer: the broker's answer in
/// full for the tenant key `id`, or the call to make asynchronously.
#[cold]
#[inline(never)]
fn in_full(policy: &Arc<Policy>, limited: &Limited, id: &TenantId) -> NotAdmitted {
    let key = id.as_str();
    match limited.handle.try_acquire_now(Some(key), Cost::default()) {
        Some(result) => {
            NotAdmitted::Decided(judge(policy, Stage::Tenant, limited, result, Some(key)))
        }
        None => NotAdmitted::Later(*id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FromExtension;

    /// axum's `from_fn` boxes a copy of the service after it per request:
    /// the tenant stage behind a `Route`, with an extractor that keeps
    /// nothing, is a block of more than 24 bytes (see `_size`).
    #[test]
    fn the_tenant_stage_is_boxed_out_of_the_smallest_chunk_class() {
        struct Claims;
        fn read(_: &Claims) -> &str {
            ""
        }
        let extractor = FromExtension::new(|c: &Claims| read(c));
        fn size_of_service<E>(_: &E) -> usize {
            std::mem::size_of::<TenantService<axum::routing::Route, E>>()
        }
        assert_eq!(std::mem::size_of_val(&extractor), 0);
        assert!(size_of_service(&extractor) > 24);
    }

    #[test]
    fn the_tenant_stage_debug_output_has_no_padding() {
        use tower::Layer;
        #[derive(Debug)]
        struct Inner;
        let config = crate::PressureConfig::from_json(
            "test",
            r#"{ "enabled": true,
                 "perTenant": { "enabled": true, "limits": { "requestsPerMinute": 5 } } }"#,
        )
        .unwrap();
        let broker = broker_core::ResourceBroker::new(broker_memory::MemoryBackend::new());
        let pressure = crate::Pressure::new(broker, &config).unwrap();
        let header = http::HeaderName::from_static("x-tenant");
        let svc = pressure
            .tenant_layer(crate::FromHeader::new(header))
            .layer(Inner);
        let shown = format!("{svc:?}");
        assert!(shown.starts_with("TenantService { inner: Inner"), "{shown}");
        assert!(
            shown.contains("x-tenant") && !shown.contains("_size"),
            "{shown}"
        );
    }
}
