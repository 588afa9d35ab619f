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
        let (now, margin) = (self.now_arg(), self.inner.margin_ms);
        let mut cmd = scripts::head(&scripts::TURN, [&times, &seen], now, margin, 0);
        cmd.arg(ask.flow)
            .arg(ask.weight.max(1))
            .arg(ask.units.max(1))
            .arg(micros(ask.active))
            .arg(if ask.last { "1" } else { "" });
        let reply = self.run(key, &scripts::TURN, cmd).await?;
        Ok(match parse::<i64>(reply)? {
            1 => Turn::Yours,
            _ => Turn::NotYet,
        })
    }
}
