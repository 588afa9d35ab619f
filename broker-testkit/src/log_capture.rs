//! Capturing `tracing` events in a test beside others in one process.
//! `tracing` caches per callsite whether anyone wants it, asking whichever
//! thread comes first; a global default answering "sometimes" makes every
//! event be checked against the capturing thread's own subscriber.

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

/// Makes `subscriber` this thread's default until the guard drops, seeing
/// every event it wants whatever other threads reach first.
pub fn capture_scoped(subscriber: impl Subscriber + Send + Sync + 'static) -> DefaultGuard {
    static GLOBAL: std::sync::Once = std::sync::Once::new();
    GLOBAL.call_once(|| {
        // Fails only if a global default is set already; that one then answers.
        let _ = tracing::subscriber::set_global_default(PerEvent);
    });
    let guard = tracing::subscriber::set_default(subscriber);
    // Again, for a callsite registered while the dispatcher was added.
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
/// guard drops (see [`capture_scoped`]).
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
