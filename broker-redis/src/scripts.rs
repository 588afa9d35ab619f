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

/// One script operand: an integer, an `f64`, or nothing (`''` in Lua).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Operand {
    /// Written as a decimal integer.
    Int(u64),
    /// Written so that Lua reads it back exactly.
    Num(f64),
    /// The empty string.
    None,
}

/// Appends `x` as Lua reads it back exactly: whole numbers below 2^53 as
/// integers (no allocation), others in Rust's shortest round-trip form.
pub(crate) fn push_num(cmd: &mut Cmd, x: f64) {
    if x.fract() == 0.0 && x.abs() < 9_007_199_254_740_992.0 {
        cmd.arg(x as i64);
    } else {
        cmd.arg(format!("{x}"));
    }
}

fn push(cmd: &mut Cmd, o: Operand) {
    match o {
        Operand::Int(n) => cmd.arg(n),
        Operand::Num(x) => {
            push_num(cmd, x);
            cmd
        }
        Operand::None => cmd.arg(""),
    };
}

/// Builds `EVALSHA sha 2 buckets leases now margin n [bucket args] ...`.
pub(crate) fn evalsha(
    script: &Script,
    keys: &KeyPair,
    now: Option<Micros>,
    margin_ms: u64,
    spec: &LimitSpec,
    mut operand: impl FnMut(usize) -> Operand,
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
        push_num(&mut cmd, p.capacity);
        push_num(&mut cmd, p.amount);
        push_num(&mut cmd, p.period);
        push(&mut cmd, operand(i));
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
