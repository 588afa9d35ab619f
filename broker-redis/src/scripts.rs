//! The Lua scripts, one per transition: `lua/lib.lua` (the helpers, and
//! the layout of `KEYS` and `ARGV`) followed by the transition's own body
//! (`lua/<transition>.lua`); and building and taking apart their calls.

use std::sync::LazyLock;

use broker_core::bucket::BucketParams;
use broker_core::{Marks, Micros, Unit};
use redis::{Cmd, Script};

/// A script with its source, which a cluster's `SCRIPT LOAD` on one node
/// needs (see `Conn::load`).
pub(crate) struct Lua {
    pub(crate) source: &'static str,
    pub(crate) compiled: LazyLock<Script>,
}

macro_rules! script {
    ($name:ident = $source:expr) => {
        pub(crate) static $name: Lua = Lua {
            source: $source,
            compiled: LazyLock::new(|| Script::new($source)),
        };
    };
    ($name:ident, $body:literal) => {
        script!(
            $name = concat!(
                include_str!("lua/lib.lua"),
                "\n",
                include_str!(concat!("lua/", $body, ".lua"))
            )
        );
    };
}

script!(TRY, "try");
// Several `try` decisions in one call: the helpers once, and try's body as a
// function run with each decision's own `KEYS` and `ARGV`.
script!(
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
// The turn ledger of weighted flows (`store::Turns`), on its own two keys.
script!(TURN, "turn");

/// Appends `x` so that Lua reads it back exactly; `''` for `None`.
fn push_num(cmd: &mut Cmd, x: Option<f64>) {
    match x {
        Some(x) if x.fract() == 0.0 && x.abs() < 9_007_199_254_740_992.0 => cmd.arg(x as i64),
        Some(x) => cmd.arg(format!("{x}")),
        None => cmd.arg(""),
    };
}

/// `EVALSHA sha 2 key1 key2 now margin n` (`''` for no `now`), then for each
/// of the `n` buckets its capacity, amount, period and `operand(i)`.
pub(crate) fn call(
    script: &Lua,
    keys: [&str; 2],
    now: Option<Micros>,
    margin_ms: u64,
    buckets: &[(Unit, BucketParams)],
    mut operand: impl FnMut(usize) -> Option<f64>,
) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.compiled.get_hash()).arg(2).arg(&keys);
    cmd.arg(now.map_or(String::new(), |now| now.to_string()));
    cmd.arg(margin_ms).arg(buckets.len());
    for (i, (_, p)) in buckets.iter().enumerate() {
        for x in [p.capacity(), p.amount(), p.period()] {
            push_num(&mut cmd, Some(x));
        }
        push_num(&mut cmd, operand(i));
    }
    cmd
}

/// The `release` of `lease` on a state's two keys.
pub(crate) fn release(keys: [&str; 2], lease: broker_core::LeaseId) -> Cmd {
    let mut cmd = call(&RELEASE, keys, None, 0, &[], |_| None);
    cmd.arg(lease);
    cmd
}

/// The arguments of `cmd` as bytes.
pub(crate) fn args_of(cmd: &Cmd) -> Vec<&[u8]> {
    cmd.args_iter()
        .map(|a| match a {
            redis::Arg::Simple(b) => b,
            _ => &[][..],
        })
        .collect()
}

/// Appends a `settle`'s booking marks and due time (`''` for none).
pub(crate) fn push_since(cmd: &mut Cmd, since: Option<Marks>) {
    let text = |x: Option<Micros>| x.map_or(String::new(), |x| x.to_string());
    for i in 0..broker_core::state::MARKED {
        cmd.arg(text(since.map(|m| m.of(i))));
    }
    cmd.arg(text(since.map(|m| m.due())));
}

/// The `settle` that gives back what `cmd`, a `try` or `book` built by
/// [`call`] with each bucket's cost as operand, took, under the
/// booking's marks (`None` for a `try`).
pub(crate) fn refund_of(cmd: &Cmd, since: Option<Marks>) -> Option<Cmd> {
    let args = args_of(cmd);
    // EVALSHA sha 2 buckets leases now margin n, then 4 per bucket.
    let n: usize = std::str::from_utf8(args.get(7)?).ok()?.parse().ok()?;
    let mut undo = redis::cmd("EVALSHA");
    undo.arg(SETTLE.compiled.get_hash())
        .arg(args.get(2..8 + 4 * n)?);
    push_since(&mut undo, since);
    Some(undo)
}

/// `cmd`, a `settle`, made to run once however often it is sent: a third key,
/// `prefix:{key}:s:<id>`, set for `ms`, marks it as run (`lua/settle.lua`).
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
    once.arg(&args[5..]).arg(ms);
    Some(once)
}

/// The `release` of `lease` on the keys of `cmd`, a call built by [`call`].
pub(crate) fn release_of(cmd: &Cmd, lease: broker_core::LeaseId) -> Option<Cmd> {
    let args = args_of(cmd);
    let key = |i: usize| std::str::from_utf8(args.get(i)?).ok();
    Some(release([key(3)?, key(4)?], lease))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::KeyPair;
    use broker_core::{LimitSpec, Limits, RateLimit};

    /// A `settle` charging 3 tokens of a fresh bucket of 10, for `key`.
    fn charge_three(key: &KeyPair, spec: &LimitSpec) -> Cmd {
        let mut cmd = call(
            &SETTLE,
            key.both(),
            Some(1_000_000),
            1_000,
            &spec.buckets,
            |_| Some(-3.0),
        );
        push_since(&mut cmd, None);
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
        SETTLE
            .compiled
            .prepare_invoke()
            .load_async(&mut c)
            .await
            .unwrap();
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
