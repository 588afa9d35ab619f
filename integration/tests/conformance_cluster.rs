//! The conformance suite on a real 3-node Redis Cluster: every case in one
//! test (starting a cluster takes a while), each on its own keys, which hash
//! to different slots and so to different nodes; each case runs twice, the
//! second time with every `try` through the coalescing batch script.

mod common;
mod conformance;

use broker_testkit::RedisCluster;

macro_rules! on_cluster {
    ($($case:ident),*) => {
        #[tokio::test]
        async fn every_conformance_case_passes_on_a_three_node_cluster() {
            let cluster = RedisCluster::start(3);
            let urls = cluster.urls();
            let mut ran = 0;
            $(
                let env = conformance::env::cluster_on(&urls, stringify!($case)).await;
                eprintln!("cluster case {}", stringify!($case));
                conformance::cases::$case(&env).await;
                // Again with every try through the coalescing batch script.
                let namespace = concat!("batched_", stringify!($case));
                let env = conformance::env::cluster_with(&urls, namespace, |b| {
                    b.coalesce_every_call()
                })
                .await;
                conformance::cases::$case(&env).await;
                ran += 1;
            )*
            assert_eq!(ran, [$(stringify!($case)),*].len());
            let nodes_with_keys = cluster
                .nodes()
                .iter()
                .filter(|n| n.command("DBSIZE").trim_start_matches(':') != "0")
                .count();
            assert!(nodes_with_keys >= 2, "the cases' keys spread over the nodes");
        }
    };
}

for_each_case!(on_cluster);
