//! The shared turn ledger of weighted flows ([`Turns`]): one `EVALSHA` of
//! `lua/turn.lua` per ask, on two sorted sets under the state's hash tag.

use async_trait::async_trait;
use broker_core::clock::micros;
use broker_core::store::{Turn, TurnAsk, Turns};
use broker_core::BackendError;

use crate::call::parse;
use crate::scripts;
use crate::RedisBackend;

#[async_trait]
impl Turns for RedisBackend {
    async fn turn(&self, key: &str, ask: &TurnAsk<'_>) -> Result<Turn, BackendError> {
        let [times, seen] = crate::keys::turn_keys(&self.inner.prefix, key, ask.level)?;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(scripts::TURN.get_hash())
            .arg(2)
            .arg(times)
            .arg(seen);
        match self.now_arg() {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        cmd.arg(self.inner.margin_ms).arg(0);
        cmd.arg(ask.flow)
            .arg(ask.weight.max(1))
            .arg(ask.units.max(1))
            .arg(micros(ask.active))
            .arg(if ask.last { "1" } else { "" });
        let reply = self.run(self.scope(key), &scripts::TURN, cmd).await?;
        Ok(match parse::<i64>(reply)? {
            1 => Turn::Yours,
            _ => Turn::NotYet,
        })
    }
}
