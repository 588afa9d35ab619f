//! Capturing `tracing` events in a test that runs beside others in one
//! process, without losing any.
//!
//! `tracing` caches, per callsite and for the whole process, whether any
//! subscriber wants its events, and works it out the first time any thread
//! reaches the callsite. While at most one dispatcher is registered it asks
//! only the reaching thread's default: a sibling test's thread with no
//! subscriber answers "never", and the event is then skipped everywhere,
//! also on a thread that captures it. [`capture_scoped`] first makes a
//! global default that answers "sometimes" for every callsite and wants no
//! event, so every callsite is checked per event against the thread's own
//! subscriber.

use std::sync::Arc;

use tracing::span;
use tracing::subscriber::{DefaultGuard, Interest};
use tracing::{Event, Metadata, Subscriber};

/// Wants no event, and asks for every callsite to be checked per event.
struct PerEvent;

impl Subscriber for PerEvent {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::sometimes()
    }
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        false
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

/// Makes `subscriber` this thread's default until the guard drops, so that
/// it sees every event of this thread that it wants, whatever other
/// threads of the process reach first (see the module's doc). Sets the
/// process's global default once (to a subscriber that wants nothing).
pub fn capture_scoped(subscriber: impl Subscriber + Send + Sync + 'static) -> DefaultGuard {
    static GLOBAL: std::sync::Once = std::sync::Once::new();
    GLOBAL.call_once(|| {
        // Fails only if a global default is set already: then that one
        // answers for threads without their own.
        let _ = tracing::subscriber::set_global_default(PerEvent);
    });
    let guard = tracing::subscriber::set_default(subscriber);
    // Registering a dispatcher rebuilt the cache; once more, from every
    // live dispatcher, for a callsite a thread was registering meanwhile.
    tracing::callsite::rebuild_interest_cache();
    guard
}

/// Log lines captured from `tracing` (fmt layer into memory).
#[derive(Clone, Default)]
pub struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    /// Everything logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// How many lines logged so far hold both `level` (as the fmt layer
    /// writes it, e.g. `ERROR`) and `text`.
    pub fn count(&self, level: &str, text: &str) -> usize {
        let all = self.text();
        all.lines()
            .filter(|l| l.contains(level) && l.contains(text))
            .count()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures `tracing` events of `level` and above on this thread until the
/// guard drops (none lost to another test's thread: see
/// [`capture_scoped`]).
pub fn capture_logs(level: tracing::Level) -> (Captured, DefaultGuard) {
    let sink = Captured::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (sink, capture_scoped(subscriber))
}
