//! The conformance suite on a real redis-server (client-time mode on a
//! virtual clock), one server per case: once as configured by default, and
//! once with every `try` sent through the coalescing batch script (as a
//! batch of one), which must decide exactly as the single-call scripts.

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

mod batch_script {
    use super::*;

    macro_rules! on_redis_batched {
        ($($case:ident),*) => {$(
            #[tokio::test]
            async fn $case() {
                let env = conformance::env::redis_batched(stringify!($case)).await;
                conformance::cases::$case(&env).await;
            }
        )*};
    }

    for_each_case!(on_redis_batched);
}
