//! The Lua scripts, one per transition, and the arguments they take.
//!
//! Every script is `lua/lib.lua` (the helpers, written once: the clock,
//! broker-core's `bucket.rs` and `state.rs` on plain values, the lease set;
//! see its header for the layout of `KEYS` and `ARGV`) followed by the
//! transition's own body (`lua/<transition>.lua`).

use std::sync::LazyLock;

use broker_core::{LimitSpec, Micros};
use redis::{Cmd, Script};

use crate::keys::KeyPair;

/// A script and its source: the source to load it on one node of a
/// cluster (see `connection::load_on_node`; [`Script`] hands its source
/// only to its own `SCRIPT LOAD`, which a cluster's client sends to every
/// primary). Every script of the backend is one, and the calls pass it
/// down as one, so the source goes with it.
pub(crate) struct Lua {
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) source: &'static str,
    script: LazyLock<Script>,
}

impl std::ops::Deref for Lua {
    type Target = Script;

    fn deref(&self) -> &Script {
        &self.script
    }
}

macro_rules! script {
    ($(#[$doc:meta])* $name:ident = $source:expr) => {
        $(#[$doc])*
        pub(crate) static $name: Lua = Lua {
            source: $source,
            script: LazyLock::new(|| Script::new($source)),
        };
    };
    ($(#[$doc:meta])* $name:ident, $body:literal) => {
        script!($(#[$doc])* $name = concat!(
            include_str!("lua/lib.lua"),
            "\n",
            include_str!(concat!("lua/", $body, ".lua"))
        ));
    };
}

script!(TRY, "try");
script!(
    /// Several `try` decisions in one call (see `lua/try_batch.lua`): the
    /// helpers defined once, the body of [`TRY`] as a function whose `KEYS`
    /// and `ARGV` are each decision's own; bucket hashes, `TIME` and
    /// numbers go through the batch's cache (`lua/batch_cache.lua`).
    TRY_BATCH = concat!(
        "local G_KEYS, G_ARGV = KEYS, ARGV\n",
        "local KEYS, ARGV\n",
        include_str!("lua/batch_cache.lua"),
        "\n",
        include_str!("lua/lib.lua"),
        "\nlocal function try()\n",
        include_str!("lua/try.lua"),
        "\nend\n",
        include_str!("lua/try_batch.lua"),
    )
);
script!(BOOK, "book");
script!(TAKE_SLOT, "take_slot");
script!(PENALTY_LEFT, "penalty_left");
script!(RELEASE, "release");
script!(RENEW, "renew");
script!(SETTLE, "settle");
script!(PENALIZE, "penalize");
script!(RECONCILE, "reconcile");
script!(
    /// The shared turn ledger of weighted flows (`store::Turns`); its keys
    /// are the ledger's two sets, not a state's buckets and leases.
    TURN,
    "turn"
);

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
    // Sized for the common call (one or two buckets, a lease), so that
    // building it does not grow its buffers.
    let n = spec.buckets.len();
    let mut cmd = Cmd::with_capacity(
        10 + 4 * n,
        64 + keys.buckets.len() + keys.leases.len() + 48 * n,
    );
    cmd.arg("EVALSHA");
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
        push_num(&mut cmd, p.capacity());
        push_num(&mut cmd, p.amount());
        push_num(&mut cmd, p.period());
        push(&mut cmd, operand(i));
    }
    cmd
}

/// Like [`evalsha`] for scripts that read no buckets (`release`).
pub(crate) fn evalsha_no_buckets(script: &Script, keys: &KeyPair) -> Cmd {
    evalsha_leases(script, keys, None, 0)
}

/// Like [`evalsha`] for scripts that read no buckets but may read the
/// clock and set the lease set's expiry (`renew`).
pub(crate) fn evalsha_leases(
    script: &Script,
    keys: &KeyPair,
    now: Option<Micros>,
    margin_ms: u64,
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
    cmd.arg(margin_ms).arg(0);
    cmd
}

/// The arguments of `cmd`, an `EVALSHA` built by [`evalsha`], as bytes.
fn args_of(cmd: &Cmd) -> Vec<&[u8]> {
    cmd.args_iter()
        .map(|a| match a {
            redis::Arg::Simple(b) => b,
            _ => &[][..],
        })
        .collect()
}

/// The `settle` that gives back the cost `cmd` took: `cmd` a `try` or
/// `book` call built by [`evalsha`], whose operand for each bucket is
/// its cost (so, as a `settle`'s delta, a refund of all of it), under the
/// booking's `marks` and `due` time (`""` for a `try`: none). `None` when
/// `cmd` is not such a call.
pub(crate) fn refund_of(
    cmd: &Cmd,
    marks: [&[u8]; broker_core::state::MARKED],
    due: &[u8],
) -> Option<Cmd> {
    let args = args_of(cmd);
    // EVALSHA sha 2 buckets leases now margin n, then 4 per bucket.
    let n: usize = std::str::from_utf8(args.get(7)?).ok()?.parse().ok()?;
    let head = args.get(2..8 + 4 * n)?;
    let mut undo = redis::cmd("EVALSHA");
    undo.arg(SETTLE.get_hash());
    for a in head {
        undo.arg(*a);
    }
    for m in marks {
        undo.arg(m);
    }
    undo.arg(due);
    Some(undo)
}

/// `cmd`, a `settle` built by [`evalsha`] or [`refund_of`], made to run
/// once however often it is sent: with a third key of its own,
/// `prefix:{key}:s:<id>` (the hash tag of its bucket key, so on its slot),
/// which the script sets for `ms` before it settles and finds set if it
/// runs again (see `lua/settle.lua`; `ms` follows the due time). For a
/// cluster, whose client sends a command again when its reply is lost with
/// the connection or its response timeout passes, after the command may
/// have run: a second `settle` would refund or charge again. `None` when
/// `cmd` is not such a call.
#[cfg(any(feature = "cluster", test))]
pub(crate) fn run_once(cmd: &Cmd, id: u64, ms: u64) -> Option<Cmd> {
    let args = args_of(cmd);
    // EVALSHA sha 2 buckets leases ...
    if args.get(2).copied() != Some(&b"2"[..]) {
        return None;
    }
    let buckets = std::str::from_utf8(args.get(3)?).ok()?;
    let tagged = buckets.strip_suffix(":b")?;
    let mut once = redis::cmd("EVALSHA");
    once.arg(args[1])
        .arg(3)
        .arg(buckets)
        .arg(*args.get(4)?)
        .arg(format!("{tagged}:s:{id:016x}"));
    for a in &args[5..] {
        once.arg(*a);
    }
    once.arg(ms);
    Some(once)
}

/// The `release` of `lease` on the keys of `cmd`, a call built by
/// [`evalsha`]; `None` when `cmd` is not such a call.
pub(crate) fn release_of(cmd: &Cmd, lease: broker_core::LeaseId) -> Option<Cmd> {
    let args = args_of(cmd);
    let keys = KeyPair {
        buckets: String::from_utf8(args.get(3)?.to_vec()).ok()?,
        leases: String::from_utf8(args.get(4)?.to_vec()).ok()?,
    };
    let mut undo = evalsha_no_buckets(&RELEASE, &keys);
    undo.arg(lease);
    Some(undo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use broker_core::{Limits, RateLimit};

    /// A `settle` charging 3 tokens of a fresh bucket of 10, for `key`.
    fn charge_three(key: &KeyPair, spec: &LimitSpec) -> Cmd {
        let mut cmd = evalsha(&SETTLE, key, Some(1_000_000), 1_000, spec, |_| {
            Operand::Num(-3.0)
        });
        // The marks and the due time: none.
        for _ in 0..=broker_core::state::MARKED {
            cmd.arg("");
        }
        cmd
    }

    /// The tokens of the first bucket of `key`.
    async fn tokens(c: &mut redis::aio::MultiplexedConnection, key: &KeyPair) -> f64 {
        redis::cmd("HGET")
            .arg(&key.buckets)
            .arg("tokens:1")
            .query_async(c)
            .await
            .unwrap()
    }

    /// A settle sent twice (as a cluster's client sends a command again
    /// after a lost reply) charges twice; made to run once, it charges
    /// once, and its key is on its bucket's hash tag.
    #[tokio::test]
    async fn a_settle_made_to_run_once_settles_once_when_sent_twice() {
        let server = broker_testkit::RedisServer::start();
        let client = redis::Client::open(server.url()).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let spec = LimitSpec::new(
            &Limits::new().rate(RateLimit::per_second(10)),
            std::time::Duration::from_secs(30),
        );
        SETTLE.prepare_invoke().load_async(&mut c).await.unwrap();
        let (twice, once) = (
            crate::keys::key_pair("t", "twice").unwrap(),
            crate::keys::key_pair("t", "once").unwrap(),
        );
        let plain = charge_three(&twice, &spec);
        for _ in 0..2 {
            let _: i64 = plain.query_async(&mut c).await.unwrap();
        }
        assert_eq!(tokens(&mut c, &twice).await, 4.0, "charged twice");
        let one = run_once(&charge_three(&once, &spec), 0xabc, 20_000).unwrap();
        let runs: Vec<i64> = [
            one.query_async(&mut c).await.unwrap(),
            one.query_async(&mut c).await.unwrap(),
        ]
        .into();
        assert_eq!(runs, [1, 0]);
        assert_eq!(tokens(&mut c, &once).await, 7.0, "charged once");
        let own: String = redis::cmd("GET")
            .arg("t:{once}:s:0000000000000abc")
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(own, "1");
        let ttl: i64 = redis::cmd("PTTL")
            .arg("t:{once}:s:0000000000000abc")
            .query_async(&mut c)
            .await
            .unwrap();
        assert!((19_000..=20_000).contains(&ttl), "{ttl}");
        assert!(run_once(&redis::cmd("PING"), 1, 1).is_none());
    }
}
