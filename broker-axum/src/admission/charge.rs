//! How the two stages of one [`crate::Pressure`] talk through extensions: the
//! route/service stage puts a [`Charge`] in the request; the tenant stage
//! takes it out, and names it in a refusal or marks it when dropped undecided,
//! so the route/service stage refunds it.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use http::{Request, Response};

use crate::policy::Policy;

/// One route/service admission that a refusal by the tenant stage of the
/// same policy gives back.
#[derive(Debug)]
pub(crate) struct Charge {
    pub(crate) policy: Arc<Policy>,
    /// The tenant stage was dropped undecided: no handler ran.
    pub(crate) left_unanswered: AtomicBool,
}

/// The request extension carrying a [`Charge`] to the tenant stage.
#[derive(Clone)]
struct Charged(Arc<Charge>);

/// The response extension naming the charge a tenant-stage refusal gives back.
#[derive(Clone)]
struct Denied(Arc<Charge>);

impl Charge {
    /// A charge of `policy`'s route/service stage, put in `req`.
    pub(crate) fn put<B>(req: &mut Request<B>, policy: &Arc<Policy>) -> Arc<Self> {
        let charge = Arc::new(Self {
            policy: policy.clone(),
            left_unanswered: AtomicBool::new(false),
        });
        req.extensions_mut().insert(Charged(charge.clone()));
        charge
    }

    /// Takes the charge of the policy `policy` out of `req`, if it has one.
    pub(crate) fn take<B>(req: &mut Request<B>, policy: u64) -> Option<Arc<Self>> {
        let ours = req
            .extensions()
            .get::<Charged>()
            .is_some_and(|c| c.0.policy.id == policy);
        ours.then(|| req.extensions_mut().remove::<Charged>())
            .flatten()
            .map(|c| c.0)
    }

    /// Names this charge on `res`, a refusal by the tenant stage.
    pub(crate) fn name_on<B>(self: Arc<Self>, res: &mut Response<B>) {
        res.extensions_mut().insert(Denied(self));
    }

    /// Whether `res` is a tenant-stage refusal of this charge (taken off `res`).
    pub(crate) fn refused_in<B>(self: &Arc<Self>, res: &mut Response<B>) -> bool {
        let ours = res
            .extensions()
            .get::<Denied>()
            .is_some_and(|d| Arc::ptr_eq(&d.0, self));
        if ours {
            res.extensions_mut().remove::<Denied>();
        }
        ours
    }
}
