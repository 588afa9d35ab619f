//! The harness starts real servers it owns.

use broker_testkit::{RedisCluster, RedisServer};

#[test]
fn server_can_be_killed_and_restarted_on_its_port() {
    let mut server = RedisServer::start();
    assert_eq!(server.command("PING"), "+PONG");
    assert_eq!(server.command("SET k v"), "+OK");
    server.kill();
    assert!(broker_testkit::raw_command(server.port(), "PING").is_err());
    server.restart();
    assert_eq!(
        server.command("GET k"),
        "$-1",
        "a restarted server is empty"
    );
}

#[test]
fn cluster_of_three_reaches_ok_state() {
    let cluster = RedisCluster::start(3);
    assert_eq!(cluster.urls().len(), 3);
    assert!(cluster.nodes()[0]
        .command("CLUSTER INFO")
        .contains("cluster_known_nodes:3"));
}
