//! The conformance suite on the in-memory backend.

mod common;
mod conformance;

macro_rules! on_memory {
    ($($case:ident),*) => {$(
        #[tokio::test]
        async fn $case() {
            let env = conformance::env::memory(stringify!($case)).await;
            conformance::cases::$case(&env).await;
        }
    )*};
}

for_each_case!(on_memory);
