//! Real `redis-server` processes on free loopback ports, started and
//! stopped by the test that owns them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// Picks a free loopback port.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("local addr").port()
}

/// `calls=N` of `command` in the text of `INFO commandstats`, 0 if absent.
///
/// ```
/// let stats = "# Commandstats\r\ncmdstat_evalsha:calls=40,usec=272,usec_per_call=6.80\r\n";
/// assert_eq!(broker_testkit::command_calls(stats, "evalsha"), 40);
/// assert_eq!(broker_testkit::command_calls(stats, "hset"), 0);
/// ```
pub fn command_calls(stats: &str, command: &str) -> u64 {
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// Sends one inline command and returns the raw reply (first chunk).
pub fn raw_command(port: u16, command: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(format!("{command}\r\n").as_bytes())?;
    let mut reader = BufReader::new(s);
    let mut first = String::new();
    reader.read_line(&mut first)?;
    if let Some(len) = first.strip_prefix('$') {
        let len: i64 = len.trim().parse().unwrap_or(-1);
        if len >= 0 {
            let mut body = vec![0; len as usize + 2];
            reader.read_exact(&mut body)?;
            return Ok(String::from_utf8_lossy(&body[..len as usize]).into_owned());
        }
    }
    Ok(first.trim_end().to_owned())
}

fn redis_server_binary() -> String {
    std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into())
}

/// One `redis-server` owned by a test. Killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments
    /// (e.g. `["--maxmemory-policy", "allkeys-lru"]`).
    pub fn start_with(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for redis-server");
        let mut server = Self {
            port: free_port(),
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        // Another test's server may take the free port first: retry elsewhere.
        for _ in 0..10 {
            server.spawn();
            if server.answering_is_own() {
                return server;
            }
            server.kill();
            server.port = free_port();
        }
        panic!("no redis-server of this test's own came up on a free port");
    }

    /// Whether the server answering on the port is the one this value
    /// started (its `process_id`).
    fn answering_is_own(&self) -> bool {
        let Some(child) = &self.child else {
            return false;
        };
        let info = raw_command(self.port, "INFO server").unwrap_or_default();
        info.lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|pid| pid.trim().parse::<u32>().ok())
            == Some(child.id())
    }

    fn spawn(&mut self) {
        let child = Command::new(redis_server_binary())
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (is it installed? .ci/run installs it)");
        self.child = Some(child);
        wait_ready(self.port);
    }

    /// The loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills the server (SIGKILL): connections drop, state is lost.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (empty).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Freezes the server (SIGSTOP): connections stay open but nothing is
    /// answered, like a hung or black-holed store.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused server run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let status = Command::new("kill")
                .arg(signal)
                .arg(child.id().to_string())
                .status()
                .expect("run kill");
            assert!(status.success(), "kill {signal} failed");
        }
    }

    /// Whether the process is running.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Runs an inline command (e.g. `"INFO commandstats"`), raw reply.
    pub fn command(&self, command: &str) -> String {
        raw_command(self.port, command).unwrap_or_default()
    }

    /// The time to live of `key` in ms (`PTTL`: -2 when absent, -1 with
    /// none).
    ///
    /// # Panics
    /// When the reply is not an integer (the server is down).
    pub fn pttl(&self, key: &str) -> i64 {
        self.command(&format!("PTTL {key}"))
            .trim()
            .trim_start_matches(':')
            .parse()
            .expect("PTTL answers an integer")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn wait_ready(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if raw_command(port, "PING")
            .map(|r| r == "+PONG")
            .unwrap_or(false)
        {
            return;
        }
        sleep(Duration::from_millis(20));
    }
    panic!("redis-server on port {port} did not answer PING within 10 s");
}

/// A loopback Redis Cluster of masters only, owned by a test.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `n` (at least 3) cluster-enabled servers and joins them.
    pub fn start(n: usize) -> Self {
        Self::start_with(n, &[])
    }

    /// [`RedisCluster::start`] with extra `redis-server` arguments for every
    /// node (e.g. `["--cluster-require-full-coverage", "no"]`).
    pub fn start_with(n: usize, extra: &[&str]) -> Self {
        assert!(n >= 3, "a Redis cluster needs at least 3 masters");
        let nodes: Vec<RedisServer> = (0..n)
            .map(|_| {
                // Each node has its own directory, so one config file name serves all.
                let mut args = vec![
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ];
                args.extend_from_slice(extra);
                RedisServer::start_with(&args)
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        let status = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run redis-cli --cluster create");
        assert!(status.success(), "redis-cli --cluster create failed");
        let deadline = Instant::now() + Duration::from_secs(20);
        'wait: while Instant::now() < deadline {
            for node in &nodes {
                if !node.command("CLUSTER INFO").contains("cluster_state:ok") {
                    sleep(Duration::from_millis(50));
                    continue 'wait;
                }
            }
            return Self { nodes };
        }
        panic!("cluster did not reach cluster_state:ok within 20 s");
    }

    /// `redis://127.0.0.1:PORT/` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Node `i`, to kill ([`RedisServer::kill`]) or freeze
    /// ([`RedisServer::pause`]) one node of the cluster.
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`, asked of the first node
    /// that answers).
    ///
    /// # Panics
    /// When no node answers with an integer.
    pub fn slot_of(&self, key: &str) -> u16 {
        self.nodes
            .iter()
            .filter(|n| n.is_running())
            .find_map(|n| {
                let reply = n.command(&format!("CLUSTER KEYSLOT {key}"));
                reply.trim().trim_start_matches(':').parse().ok()
            })
            .expect("CLUSTER KEYSLOT answers an integer")
    }

    /// The index of the node serving `key`'s slot; ask before freezing a
    /// node, which answers nothing.
    ///
    /// # Panics
    /// When no node answers, or no node serves the slot.
    pub fn node_of(&self, key: &str) -> usize {
        let slot = self.slot_of(key);
        let nodes = self
            .nodes
            .iter()
            .filter(|n| n.is_running())
            .map(|n| n.command("CLUSTER NODES"))
            .find(|r| !r.is_empty())
            .expect("a node answers CLUSTER NODES");
        // `<id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch>
        // <link> <slot or range>...`, one node a line.
        let port = nodes
            .lines()
            .find_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let serves = fields.iter().skip(8).any(|range| {
                    let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                    match (lo.parse::<u16>(), hi.parse::<u16>()) {
                        (Ok(lo), Ok(hi)) => (lo..=hi).contains(&slot),
                        _ => false,
                    }
                });
                let addr = fields.get(1)?.split('@').next()?;
                serves.then(|| addr.rsplit(':').next()?.parse::<u16>().ok())?
            })
            .unwrap_or_else(|| panic!("no node serves slot {slot}"));
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .unwrap_or_else(|| {
                panic!("slot {slot} is served by port {port}, not a node of this cluster")
            })
    }
}
