//! The conformance suite on a real redis-server (client-time mode on a
//! virtual clock), one server per case.

mod common;
mod conformance;

macro_rules! on_redis {
    ($($case:ident),*) => {$(
        #[tokio::test]
        async fn $case() {
            let env = conformance::env::redis(stringify!($case)).await;
            conformance::cases::$case(&env).await;
        }
    )*};
}

for_each_case!(on_redis);
