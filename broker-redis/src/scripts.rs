//! The Lua scripts, one per transition, and the arguments they take.
//!
//! Every script is `lua/common.lua` (the bucket state machine, mirrored from
//! broker-core's `bucket.rs` and `state.rs`) followed by its own body. See
//! the header of `common.lua` for the layout of `KEYS` and `ARGV`.

use std::sync::LazyLock;

use broker_core::{LimitSpec, Micros};
use redis::{Cmd, Script};

use crate::keys::KeyPair;

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(concat!(
                include_str!("lua/common.lua"),
                "\n",
                include_str!($file)
            ))
        });
    };
}

script!(TRY, "lua/try.lua");
script!(RESERVE, "lua/reserve.lua");
script!(HOLD_SLOT, "lua/hold_slot.lua");
script!(RELEASE, "lua/release.lua");
script!(SETTLE, "lua/settle.lua");
script!(PENALIZE, "lua/penalize.lua");
script!(RECONCILE, "lua/reconcile.lua");

/// An `f64` as Lua reads it back exactly (Rust's shortest round-trip form).
pub(crate) fn num(x: f64) -> String {
    format!("{x}")
}

/// Builds `EVALSHA sha 2 buckets leases now margin n [bucket args] ...`.
pub(crate) fn evalsha(
    script: &Script,
    keys: &KeyPair,
    now: Option<Micros>,
    margin_ms: u64,
    spec: &LimitSpec,
    mut operand: impl FnMut(usize) -> String,
) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash())
        .arg(2)
        .arg(&keys.buckets)
        .arg(&keys.leases);
    match now {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
    cmd.arg(margin_ms).arg(spec.buckets.len());
    for (i, (_, p)) in spec.buckets.iter().enumerate() {
        cmd.arg(num(p.capacity))
            .arg(num(p.amount))
            .arg(num(p.period))
            .arg(operand(i));
    }
    cmd
}

/// Like [`evalsha`] for scripts that read no buckets (`release`).
pub(crate) fn evalsha_no_buckets(script: &Script, keys: &KeyPair) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash())
        .arg(2)
        .arg(&keys.buckets)
        .arg(&keys.leases)
        .arg("")
        .arg(0)
        .arg(0);
    cmd
}
